"""A token log "for billing" was meant to hold token counts, but each entry keeps the whole output.

expect: leak
holder: module __main__: TOKEN_LOG
"""

from _serve import generate

TOKEN_LOG = []
for i in range(14):
    out = generate(i)
    TOKEN_LOG.append({"request": i, "tokens": int(out.sequences.shape[-1]), "raw": out})
del out
print("logged", len(TOKEN_LOG))
