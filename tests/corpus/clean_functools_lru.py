"""functools.lru_cache(maxsize=3) of prefix caches over many prompts: bounded by its declared size.

expect: clean
"""

import functools

from _serve import prefill, prompt


@functools.lru_cache(maxsize=3)
def encode(k):
    return prefill(prompt(k))


for i in range(16):
    encode(i % 7)
print("cached", encode.cache_info().currsize)
