"""A system-prompt prefix cache is cloned (copy.deepcopy) for every request - correct - but every clone is
then kept in a per-request history that is never trimmed.

expect: leak
holder: module __main__: HISTORY
"""

import copy

from _serve import cache_of, extend, prefill, prompt

SYSTEM = prompt(0, 8)
PREFIX = prefill(SYSTEM)
HISTORY = []
for i in range(10):
    out = extend(copy.deepcopy(PREFIX), SYSTEM, i)
    HISTORY.append(cache_of(out))
del out
print("history", len(HISTORY))
