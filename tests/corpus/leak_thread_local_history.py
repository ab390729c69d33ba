"""Worker threads of a pool keep a per-thread history of outputs in a threading.local nobody trims; the
workers stay alive (daemon threads waiting for work) until the process exits.

expect: leak
holder: module __main__: LOCAL
"""

import queue
import threading

from _serve import generate, serve_jobs

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


serve_jobs(worker, JOBS, DONE, 16)
