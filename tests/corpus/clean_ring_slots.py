"""A fixed ring of four slots preallocated as a list: request i overwrites slot i % 4, so at most four
outputs are kept however long the server runs.

expect: clean
"""

from _serve import generate

SLOTS = [None] * 4
for i in range(20):
    SLOTS[i % 4] = generate(i)
print("slots", sum(s is not None for s in SLOTS))
