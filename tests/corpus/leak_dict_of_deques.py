"""Per-user recent-caches deques are bounded (maxlen=2), but a deque is added for every new user and no
user is ever dropped: the dict of bounded deques grows.

expect: leak
holder: module __main__: RECENT_BY_USER
"""

from collections import deque

from _serve import cache_of, generate

RECENT_BY_USER = {}
for i in range(16):
    RECENT_BY_USER.setdefault(f"user-{i // 2}", deque(maxlen=2)).append(cache_of(generate(i)))
print("users", len(RECENT_BY_USER))
