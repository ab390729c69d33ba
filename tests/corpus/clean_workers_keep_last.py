"""Two daemon worker threads serve a job queue; each keeps its last output in a local variable while it
waits for the next job (the worker loop never clears it): at most two outputs, however many requests.

expect: clean
"""

import queue
import threading

from _serve import generate, serve_jobs

JOBS = queue.Queue()
DONE = threading.Semaphore(0)
TOKENS = []


def worker():
    while True:
        i = JOBS.get()
        out = generate(i)
        TOKENS.append(int(out.sequences[0, -1]))
        DONE.release()


serve_jobs(worker, JOBS, DONE, 24, threads=2, name="worker")
