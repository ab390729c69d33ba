"""A cache class derived from dict with a maxsize it never enforces (__setitem__ forgot to evict).

expect: leak
holder: module __main__: PROMPT_CACHE
"""

from _serve import cache_of, generate


class PromptCache(dict):
    def __init__(self, max_entries):
        super().__init__()
        self.limit = max_entries


PROMPT_CACHE = PromptCache(max_entries=4)
for i in range(14):
    PROMPT_CACHE[f"p{i}"] = cache_of(generate(i))
print("entries", len(PROMPT_CACHE))
