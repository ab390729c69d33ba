"""A pre-fork style server calls gc.freeze() after warm-up (to keep start-up objects out of GC passes); its
session table was created before the freeze, so the garbage collector no longer reports it as a referrer.

expect: leak
holder: module __main__: SESSIONS
"""

import gc

from _serve import generate

SESSIONS = {}
gc.freeze()
for i in range(12):
    SESSIONS[f"s{i}"] = generate(i)
print("sessions", len(SESSIONS))
