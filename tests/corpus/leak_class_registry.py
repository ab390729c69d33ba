"""Every request object registers itself in a class-level registry "for cancellation" and is never removed.

expect: leak
holder: class __main__.Request: registry
"""

from _serve import generate


class Request:
    registry = {}  # noqa: RUF012 - the shape under test

    def __init__(self, i):
        self.id = f"req-{i}"
        self.output = None
        Request.registry[self.id] = self

    def run(self, i):
        self.output = generate(i)


for i in range(12):
    Request(i).run(i)
print("registered", len(Request.registry))
