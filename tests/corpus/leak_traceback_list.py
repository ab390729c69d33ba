"""Failed requests keep sys.exc_info() "for the error page": each traceback's frames hold the cache.

expect: leak
holder: module __main__: FAILURES
"""

import sys

from _serve import cache_of, generate

FAILURES = []


def handle(i):
    cache = cache_of(generate(i))
    raise RuntimeError(f"downstream rejected request {i} ({len(cache.layers)} layers)")


for i in range(10):
    try:
        handle(i)
    except RuntimeError:
        FAILURES.append(sys.exc_info())
print("failures", len(FAILURES))
