"""A token log that grows with every request but holds only token ids and counts, never KV.

expect: clean
"""

from _serve import generate

TOKEN_LOG = []
for i in range(16):
    out = generate(i)
    TOKEN_LOG.append({"request": i, "tokens": out.sequences[0].tolist()})
del out
print("logged", len(TOKEN_LOG))
