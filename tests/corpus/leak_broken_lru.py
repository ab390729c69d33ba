"""A hand-written OrderedDict "LRU" whose eviction check is wrong (it compares with the wrong variable),
so it never evicts: every session's cache stays.

expect: leak
holder: module __main__: LRU
"""

from collections import OrderedDict

from _serve import cache_of, generate

LRU = OrderedDict()
CAPACITY = 4


def put(key, value):
    LRU[key] = value
    LRU.move_to_end(key)
    if len(LRU) > CAPACITY * 100:  # the bug: meant len(LRU) > CAPACITY
        LRU.popitem(last=False)


for i in range(14):
    put(f"s{i}", cache_of(generate(i)))
print("lru", len(LRU))
