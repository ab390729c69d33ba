"""A debugging hook registered per request on the model's output weight (``register_hook``), each
closing over that request's cache; the hooks are never removed.

expect: leak
holder: module __main__: MODEL
holder: module _serve: MODEL
"""

from _serve import MODEL, cache_of, generate

for i in range(12):
    cache = cache_of(generate(i))
    MODEL.lm_head.weight.register_hook(lambda grad, cache=cache: grad)
del cache
print("hooks", len(MODEL.lm_head.weight._backward_hooks))
