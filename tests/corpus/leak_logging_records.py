"""A logging handler buffers records for a crash report; each record's args carry the request's output
(logger.debug("done %s", out)), so the buffer holds every output.

expect: leak
holder: module __main__: CRASH_BUFFER
holder: BufferingHandler.buffer
"""

import logging
import logging.handlers

from _serve import generate

CRASH_BUFFER = logging.handlers.BufferingHandler(capacity=10_000)
log = logging.getLogger("server")
log.setLevel(logging.DEBUG)
log.addHandler(CRASH_BUFFER)
log.propagate = False

for i in range(12):
    out = generate(i)
    log.debug("request %d done: %s", i, out)
del out
print("buffered", len(CRASH_BUFFER.buffer))
