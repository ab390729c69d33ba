"""A debugging endpoint keeps each request's first-layer keys as numpy arrays for later inspection:
``tensor.numpy()`` shares the tensor's memory, so every array keeps its KV alive through ``.base`` (numpy
arrays are not tracked by the garbage collector: no ``gc.get_referrers`` finds them); a dict of views of
them is untracked too.

expect: leak
holder: module __main__: INSPECT
holder: module __main__: LAST_ROWS
"""

from _serve import cache_of, generate

INSPECT = []
LAST_ROWS = {}

for i in range(12):
    out = generate(i)
    keys = cache_of(out).layers[0].keys.numpy()
    if i % 2:
        INSPECT.append(keys)
    else:
        LAST_ROWS[f"req-{i}"] = keys[0, :, -1:]
    del out, keys
print("kept", len(INSPECT), len(LAST_ROWS))
