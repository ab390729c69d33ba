"""The last three caches are kept for follow-up questions in a deque(maxlen=3).

expect: clean
"""

from collections import deque

from _serve import cache_of, generate

RECENT = deque(maxlen=3)
for i in range(16):
    RECENT.append(cache_of(generate(i)))
print("recent", len(RECENT))
