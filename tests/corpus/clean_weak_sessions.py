"""Sessions in a weakref.WeakValueDictionary; each session object is dropped when its client leaves, so
its output goes with it.

expect: clean
"""

import weakref

from _serve import generate


class Session:
    def __init__(self, out):
        self.out = out


SESSIONS = weakref.WeakValueDictionary()
alive = []
for i in range(14):
    s = Session(generate(i))
    SESSIONS[f"s{i}"] = s
    alive.append(s)
    if len(alive) > 2:
        alive.pop(0)  # the client went away
del s
print("sessions", len(SESSIONS))
