"""A producer/consumer queue: the consumer thread reads every output and keeps only its length.

expect: clean
"""

import queue
import threading

from _serve import generate

RESULTS = queue.Queue()
LENGTHS = []


def consumer():
    while True:
        out = RESULTS.get()
        if out is None:
            return
        LENGTHS.append(int(out.sequences.shape[-1]))
        del out


th = threading.Thread(target=consumer)
th.start()
for i in range(12):
    RESULTS.put(generate(i))
RESULTS.put(None)
th.join()
print("consumed", len(LENGTHS))
