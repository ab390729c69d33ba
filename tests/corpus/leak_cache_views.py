"""Each request keeps a small view of its layer-0 keys "for debugging attention"; a view keeps the whole
storage alive.

expect: leak
holder: module __main__: SNIPPETS
"""

from _serve import cache_of, generate

SNIPPETS = []
for i in range(12):
    cache = cache_of(generate(i))
    SNIPPETS.append(cache.layers[0].keys[:, :, :2])
del cache
print("snippets", len(SNIPPETS))
