"""functools.lru_cache(maxsize=None) memoises the cache of every prompt; prompts never repeat.

expect: leak
holder: lru_cache
"""

import functools

from _serve import prefill, prompt


@functools.lru_cache(maxsize=None)  # noqa: UP033 - the spelling users write
def encode(i):
    return prefill(prompt(i))


for i in range(12):
    encode(i)
print("cached", encode.cache_info().currsize)
