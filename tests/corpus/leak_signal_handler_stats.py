"""A stats object whose bound method is the SIGUSR1 handler ("dump stats on signal") keeps every output;
only the signal module's C table holds the handler.

expect: leak
holder: signal handler SIGUSR1
"""

import signal

from _serve import generate


class Stats:
    def __init__(self):
        self.outputs = []

    def dump(self, signum, frame):
        print("requests", len(self.outputs))


def serve(n):
    stats = Stats()
    signal.signal(signal.SIGUSR1, stats.dump)
    for i in range(n):
        stats.outputs.append(generate(i))


serve(12)
print("served")
