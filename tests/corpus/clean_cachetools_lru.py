"""A cachetools.LRUCache(maxsize=4) of session outputs.

expect: clean
"""

import cachetools

from _serve import generate

CACHE = cachetools.LRUCache(maxsize=4)
for i in range(18):
    CACHE[f"s{i % 9}"] = generate(i)
print("cached", len(CACHE))
