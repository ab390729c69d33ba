"""gc.set_debug(gc.DEBUG_SAVEALL) left on from a debugging session: every request's cyclic garbage (a
request object that refers to itself) is kept in gc.garbage instead of freed.

expect: leak
holder: module gc: garbage
"""

import gc

from _serve import generate


class Job:
    def __init__(self, i):
        self.me = self  # a cycle: freed only by the cyclic collector
        self.output = generate(i)


gc.set_debug(gc.DEBUG_SAVEALL)
for i in range(10):
    Job(i)
gc.collect()
print("garbage", len(gc.garbage) > 0)
