"""A memo of prefix caches keyed by system prompt, for the three system prompts this service has (each
request clones its prompt's prefix): the memo stops growing once each prompt has been seen.

expect: clean
"""

import copy

from _serve import extend, prefill, prompt

SYSTEM_PROMPTS = {"support": 1, "sales": 2, "legal": 3}
PREFIX_MEMO = {}
for i in range(24):
    name = list(SYSTEM_PROMPTS)[i % 3]
    ids = prompt(SYSTEM_PROMPTS[name], 8)
    if name not in PREFIX_MEMO:
        PREFIX_MEMO[name] = prefill(ids)
    out = extend(copy.deepcopy(PREFIX_MEMO[name]), ids, i)
del out
print("memo", len(PREFIX_MEMO))
