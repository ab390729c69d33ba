"""Per-session results in a WeakKeyDictionary, but each value refers back to its session key, so no
session is ever collected: the weak keys never die (the classic WeakKeyDictionary leak).

expect: leak
holder: RESULTS
"""

import weakref

from _serve import generate


class Session:
    def __init__(self, n):
        self.n = n


RESULTS = weakref.WeakKeyDictionary()
for i in range(12):
    s = Session(i)
    RESULTS[s] = {"session": s, "output": generate(i)}
del s
print("sessions", len(RESULTS))
