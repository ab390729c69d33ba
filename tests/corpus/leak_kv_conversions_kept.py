"""An "attention inspector" keeps, for every request, each layer's keys and values passed through the
conversions it applies before plotting - `.to()` the tensor's own dtype and device, `.contiguous()`,
`.detach()` - in a list that is never trimmed. None of them copies: the kept tensors are the request's KV.

expect: leak
holder: module __main__: INSPECTED
"""

from _serve import cache_of, generate

INSPECTED = []
for i in range(10):
    cache = cache_of(generate(i))
    INSPECTED.append([layer.keys.to(layer.keys.dtype).contiguous().detach() for layer in cache.layers]
                     + [layer.values.to(layer.values.device) for layer in cache.layers])
del cache
print("inspected", len(INSPECTED))
