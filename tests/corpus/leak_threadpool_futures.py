"""A thread pool serves requests; every Future is kept in a list "for metrics" and holds its output.

expect: leak
holder: module __main__: FUTURES
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from _serve import generate

LOCK = threading.Lock()
FUTURES = []


def serve(i):
    with LOCK:
        return generate(i)


with ThreadPoolExecutor(max_workers=2) as pool:
    for i in range(12):
        FUTURES.append(pool.submit(serve, i))
print("done", sum(f.done() for f in FUTURES))
