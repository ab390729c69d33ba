"""Request logging through a BufferingHandler that flushes every few records; records carry only numbers.

expect: clean
"""

import logging
import logging.handlers

from _serve import generate, only_to

handler = logging.handlers.BufferingHandler(capacity=4)
log = only_to("server", handler, logging.INFO)
for i in range(14):
    out = generate(i)
    log.info("request %d: %d tokens", i, out.sequences.shape[-1])
del out
print("logged", 14)
