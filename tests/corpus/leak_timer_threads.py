"""Each request starts a daemon threading.Timer that would drop its output after an hour; the timers
(threads waiting on an event, with the outputs in their args) are still pending.

expect: leak
holder: Timer
"""

import threading

from _serve import generate


def drop(out):
    out.clear()


for i in range(10):
    t = threading.Timer(3600, drop, args=(generate(i),))
    t.daemon = True
    t.start()
del t
print("timers", threading.active_count())
