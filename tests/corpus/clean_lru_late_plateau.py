"""An OrderedDict LRU of 17 caches under 24 distinct prompts: it fills for 70% of the run (no early
sample sees it full), then evicts one entry per request. Bounded.

expect: clean
"""

from collections import OrderedDict

from _serve import cache_of, generate

CAPACITY = 17
LRU = OrderedDict()
for i in range(24):
    LRU[f"p{i}"] = cache_of(generate(i))
    if len(LRU) > CAPACITY:
        LRU.popitem(last=False)
print("lru", len(LRU))
