"""A debugging forward hook on the model saves every call's past_key_values into a list; the hook was
meant to be removed after one request.

expect: leak
holder: module __main__: CAPTURED
"""

from _serve import MODEL, generate

CAPTURED = []


def capture(module, args, kwargs, output):
    cache = kwargs.get("past_key_values") or kwargs.get("cache")
    if cache is not None and all(c is not cache for c in CAPTURED):
        CAPTURED.append(cache)


MODEL.register_forward_hook(capture, with_kwargs=True)
for i in range(10):
    generate(i)
print("captured", len(CAPTURED))
