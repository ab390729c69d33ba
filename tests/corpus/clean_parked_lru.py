"""A chat server "parks" finished sessions' caches at half precision (each layer's keys and values moved with
``.to(torch.float16)``, what a device move does to a layer) in an LRU of three sessions: the oldest parked
session is dropped when a fourth arrives. Bounded.

expect: clean
"""

from collections import OrderedDict

from _serve import cache_of, generate
from _shapes import park

PARKED = OrderedDict()

for i in range(12):
    PARKED[f"session-{i}"] = park(cache_of(generate(i)))
    while len(PARKED) > 3:
        PARKED.popitem(last=False)
print("parked", list(PARKED))
