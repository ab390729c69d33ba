"""A daemon worker thread accumulates outputs in a local variable of its loop and is still blocked on
its queue when the process exits: an executing frame of another thread holds them.

expect: leak
holder: frame worker()
"""

import queue
import threading

from _serve import generate, serve_jobs

JOBS = queue.Queue()
DONE = threading.Semaphore(0)
LOCK = threading.Lock()


def worker():
    finished = []
    while True:
        i = JOBS.get()
        with LOCK:
            finished.append(generate(i))
        DONE.release()


serve_jobs(worker, JOBS, DONE, 12, threads=1, name="batcher")
