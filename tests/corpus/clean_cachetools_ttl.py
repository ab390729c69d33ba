"""A cachetools.TTLCache(maxsize=3, ttl=...) of prefix caches, with a fake clock that moves per request.

expect: clean
"""

import cachetools

from _serve import prefill, prompt

NOW = [0.0]
CACHE = cachetools.TTLCache(maxsize=3, ttl=5, timer=lambda: NOW[0])
for i in range(16):
    NOW[0] += 1
    key = i % 5
    if key not in CACHE:
        CACHE[key] = prefill(prompt(key))
print("cached", len(CACHE))
