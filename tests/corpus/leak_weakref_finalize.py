"""Weak references misused: a weakref.finalize callback meant to log a session's end gets the session's
output as an argument - the finalizer registry holds its arguments strongly - and the sessions stay in a
list, so nothing is ever finalized (not even at exit: the finalizers are marked not to run at shutdown).

expect: leak
holder: finalize
"""

import weakref

from _serve import generate


class Session:
    pass


def report(out):
    print("session ended", out.sequences.shape)


SESSIONS = []
for i in range(10):
    s = Session()
    weakref.finalize(s, report, generate(i)).atexit = False
    SESSIONS.append(s)
print("sessions", len(SESSIONS))
