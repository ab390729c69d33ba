"""Worker threads of a pool keep a per-thread history of outputs in a threading.local nobody trims; the
workers stay alive (daemon threads waiting for work) until the process exits.

expect: leak
holder: module __main__: LOCAL
"""

import queue
import threading

from _serve import generate

LOCAL = threading.local()
LOCK = threading.Lock()
JOBS = queue.Queue()
DONE = threading.Semaphore(0)


def worker():
    LOCAL.history = []
    while True:
        i = JOBS.get()
        with LOCK:
            out = generate(i)
        LOCAL.history.append(out)
        del out
        DONE.release()


for _ in range(2):
    threading.Thread(target=worker, daemon=True).start()
for i in range(16):
    JOBS.put(i)
for _ in range(16):
    DONE.acquire()
print("served", 16)
