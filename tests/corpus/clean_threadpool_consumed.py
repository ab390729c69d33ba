"""A thread pool serves requests; each result is read and the futures are dropped.

expect: clean
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from _serve import generate

LOCK = threading.Lock()


def serve(i):
    with LOCK:
        return int(generate(i).sequences.shape[-1])


with ThreadPoolExecutor(max_workers=2) as pool:
    lengths = list(pool.map(serve, range(14)))
print("served", len(lengths))
