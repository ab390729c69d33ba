"""A deep copy of each request's cache is kept for the one user being served, replaced every turn (one copy
alive at a time, never updated): bounded, the latest copy is one constant-size retained cache (info at most).

expect: clean
"""

import copy

from _serve import cache_of, generate

LAST = {}
for i in range(12):
    out = generate(i)
    LAST["user"] = copy.deepcopy(cache_of(out))
del out
print("kept", len(LAST))
