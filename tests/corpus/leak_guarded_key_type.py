"""Sessions keyed by a tenant-id type (a ``str`` subclass) whose ``__repr__`` refuses, so that ids never reach
the logs; per-slot results keyed by an ``IntEnum`` with the same guard. Nothing evicts either table.

expect: leak
holder: module __main__: SESSIONS
holder: module __main__: BY_SLOT
"""

import enum

from _serve import cache_of, generate


class TenantId(str):
    def __repr__(self):
        raise TypeError("tenant ids are not printable")


class Slot(enum.IntEnum):
    A = 0
    B = 1
    C = 2

    def __repr__(self):
        raise TypeError("slots are not printable")


SESSIONS = {}
BY_SLOT = {}
for i in range(12):
    out = generate(i)
    if i < 9:
        SESSIONS[TenantId(f"tenant-{i}")] = cache_of(out)
    else:
        BY_SLOT[Slot(i - 9)] = out
del out
print("sessions", len(SESSIONS), "slots", len(BY_SLOT))
