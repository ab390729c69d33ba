"""A recent-results buffer halved whenever it passes six entries: its size saws between four and six, so
samples at request ends see it at any point of the cycle. Bounded.

expect: clean
"""

from _serve import generate

RECENT = []
for i in range(24):
    RECENT.append(generate(i))
    if len(RECENT) > 6:
        del RECENT[:3]
print("recent", len(RECENT))
