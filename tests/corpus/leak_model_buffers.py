"""Each request's first-layer keys are registered as a (non-persistent) buffer on the model for a later
visualisation: the model's _buffers dict grows by one cache tensor per request.

expect: leak
holder: _buffers
"""

from _serve import MODEL, cache_of, generate

for i in range(12):
    cache = cache_of(generate(i))
    MODEL.register_buffer(f"kv_{i}", cache.layers[0].keys, persistent=False)
del cache
print("buffers", sum(1 for _ in MODEL.buffers()))
