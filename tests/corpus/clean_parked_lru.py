"""A chat server "parks" finished sessions' caches at half precision (each layer's keys and values moved with
``.to(torch.float16)``, what a device move does to a layer) in an LRU of three sessions: the oldest parked
session is dropped when a fourth arrives. Bounded.

expect: clean
"""

from collections import OrderedDict

import torch

from _serve import cache_of, generate

PARKED = OrderedDict()


def park(cache):
    for layer in cache.layers:
        layer.keys = layer.keys.to(torch.float16)
        layer.values = layer.values.to(torch.float16)
    return cache


for i in range(12):
    PARKED[f"session-{i}"] = park(cache_of(generate(i)))
    while len(PARKED) > 3:
        PARKED.popitem(last=False)
print("parked", list(PARKED))
