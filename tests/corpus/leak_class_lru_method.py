"""lru_cache(maxsize=None) on a method: the cache lives on the class and keeps every instance (and its
encoded prefix) alive; a new service object is made per request.

expect: leak
holder: class __main__.PrefixService: encode
"""

import functools

from _serve import prefill, prompt


class PrefixService:
    def __init__(self, i):
        self.i = i

    @functools.lru_cache(maxsize=None)  # noqa: B019, UP033 - the leak under test, as users write it
    def encode(self):
        return prefill(prompt(self.i))


for i in range(10):
    PrefixService(i).encode()
print("cached", PrefixService.encode.cache_info().currsize)
