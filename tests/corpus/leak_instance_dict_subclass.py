"""A worker whose instance ``__dict__`` is replaced by a recording dict subclass: every assignment of
``worker.last`` is also appended to the dict's own ``history`` attribute.

expect: leak
holder: module __main__: WORKER
"""

from _serve import generate


class Recording(dict):
    def __init__(self):
        super().__init__()
        self.history = []

    def __setitem__(self, key, value):
        self.history.append(value)
        super().__setitem__(key, value)


class Worker:
    pass


WORKER = Worker()
WORKER.__dict__ = Recording()
for i in range(12):
    WORKER.__dict__["last"] = generate(i)
print("history", len(WORKER.__dict__.history))
