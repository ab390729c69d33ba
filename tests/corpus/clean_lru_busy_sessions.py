"""An OrderedDict LRU of session objects (move_to_end on a hit, popitem(last=False) on overflow): the two
busiest sessions stay cached all run, guests are evicted. Bounded.

expect: clean
"""

from collections import OrderedDict

from _serve import generate


class Session:
    def __init__(self, name):
        self.name = name
        self.last_output = None


SESSIONS = OrderedDict()
CAPACITY = 4


def session(name):
    if name in SESSIONS:
        SESSIONS.move_to_end(name)
        return SESSIONS[name]
    s = SESSIONS[name] = Session(name)
    while len(SESSIONS) > CAPACITY:
        SESSIONS.popitem(last=False)
    return s


for i in range(24):
    name = ("alice", "bob")[i % 2] if i % 3 else f"guest-{i}"
    session(name).last_output = generate(i)
print("sessions", list(SESSIONS))
