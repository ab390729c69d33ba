"""Worker threads keep only their latest output in a threading.local (replaced on every request); the
workers stay alive waiting for work.

expect: clean
"""

import queue
import threading

from _serve import generate, serve_jobs

LOCAL = threading.local()
LOCK = threading.Lock()
JOBS = queue.Queue()
DONE = threading.Semaphore(0)


def worker():
    while True:
        i = JOBS.get()
        with LOCK:
            LOCAL.latest = generate(i)
        DONE.release()


serve_jobs(worker, JOBS, DONE, 14)
