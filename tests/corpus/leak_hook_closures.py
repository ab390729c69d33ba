"""Shutdown hooks registered per request, each closing over its request's cache, in a global list.

expect: leak
holder: module __main__: ON_SHUTDOWN
"""

from _serve import cache_of, generate

ON_SHUTDOWN = []


def handle(i):
    cache = cache_of(generate(i))
    ON_SHUTDOWN.append(lambda: print("closing", len(cache.layers)))


for i in range(10):
    handle(i)
print("hooks", len(ON_SHUTDOWN))
