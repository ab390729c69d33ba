"""The same "attention inspector" as leak_kv_conversions_kept, but it keeps only a summary (a norm per layer,
a Python float) and drops the converted tensors with the request.

expect: clean
"""

from _serve import cache_of, generate

SUMMARIES = []
for i in range(10):
    cache = cache_of(generate(i))
    converted = [layer.keys.to(layer.keys.dtype).contiguous().detach() for layer in cache.layers]
    SUMMARIES.append([float(t.norm()) for t in converted])
    del converted
del cache
print("summaries", len(SUMMARIES))
