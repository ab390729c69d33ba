"""After each request a deep copy of its cache is kept per user "so the next turn can resume from it"; no
turn ever resumes, so the copies are never updated - kv-guardian never sees them in `Cache.update` - and the
per-user dict only grows (every request is a new user).

expect: leak
holder: module __main__: RESUME
"""

import copy

from _serve import cache_of, generate

RESUME = {}
for i in range(12):
    out = generate(i)
    RESUME[f"user-{i}"] = copy.deepcopy(cache_of(out))
del out
print("kept", len(RESUME))
