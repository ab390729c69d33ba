"""Results are put on a queue for a consumer thread that was never started.

expect: leak
holder: module __main__: RESULTS
"""

import queue

from _serve import generate

RESULTS = queue.Queue()
for i in range(12):
    RESULTS.put(generate(i))
print("queued", RESULTS.qsize())
