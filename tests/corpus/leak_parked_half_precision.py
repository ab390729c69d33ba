"""A chat server "parks" each finished session's cache to save memory: every layer's keys and values are moved
to float16 (``layer.keys = layer.keys.to(torch.float16)``, what a device move does to a layer) and the cache is
kept per session, for a resume that never comes. Sessions are never closed.

expect: leak
holder: module __main__: PARKED
"""

from _serve import cache_of, generate
from _shapes import park

PARKED = {}

for i in range(12):
    PARKED[f"session-{i}"] = park(cache_of(generate(i)))
print("parked", len(PARKED))
