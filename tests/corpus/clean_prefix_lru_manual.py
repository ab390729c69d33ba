"""Prefix caches of system prompts in a hand-written OrderedDict LRU (capacity 2, five prompts), each
cloned per request.

expect: clean
"""

import copy
from collections import OrderedDict

from _serve import extend, prefill, prompt

PREFIXES = OrderedDict()
SYSTEM = [prompt(k, 8) for k in range(5)]


def prefix(k):
    if k in PREFIXES:
        PREFIXES.move_to_end(k)
        return PREFIXES[k]
    PREFIXES[k] = prefill(SYSTEM[k])
    if len(PREFIXES) > 2:
        PREFIXES.popitem(last=False)
    return PREFIXES[k]


for i in range(16):
    k = (i * 3) % 5
    out = extend(copy.deepcopy(prefix(k)), SYSTEM[k], i)
del out
print("prefixes", len(PREFIXES))
