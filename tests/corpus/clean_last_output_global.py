"""Only the last output is kept, in a module variable, for a /last endpoint.

expect: clean
"""

from _serve import generate

LAST = None
for i in range(12):
    LAST = generate(i)
print("last", LAST.sequences.shape)
