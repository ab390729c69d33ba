"""An event bus whose listeners are C bound methods: each request's result list registers its own
``append`` (a sink for late events), which keeps the list, and its output, alive.

expect: leak
holder: class __main__.Bus: listeners
"""

from _serve import generate


class Bus:
    listeners = []  # noqa: RUF012 - the shape under test


def handle(i):
    sink = [generate(i)]
    Bus.listeners.append(sink.append)


for i in range(12):
    handle(i)
print("listeners", len(Bus.listeners))
