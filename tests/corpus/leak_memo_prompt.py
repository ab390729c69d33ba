"""An unbounded memo of caches keyed by prompt text "to skip recomputation"; every prompt is new.

expect: leak
holder: module __main__: MEMO
"""

from _serve import cache_of, generate

MEMO = {}

for i in range(12):
    MEMO[f"Tell me about item number {i} in detail"] = cache_of(generate(i))
print("memo", len(MEMO))
