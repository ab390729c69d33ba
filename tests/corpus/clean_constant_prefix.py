"""One system-prompt prefix cache computed at start and cloned (copy.deepcopy) for every request; the
clones are dropped. The one constant cache nobody declared stays info.

expect: clean
"""

import copy

from _serve import extend, prefill, prompt

SYSTEM = prompt(0, 8)
PREFIX = prefill(SYSTEM)
for i in range(10):
    out = extend(copy.deepcopy(PREFIX), SYSTEM, i)
del out
print("served", 10)
