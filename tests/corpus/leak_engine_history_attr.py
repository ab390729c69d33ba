"""A long-lived engine object keeps a history of outputs on an attribute "for analytics".

expect: leak
holder: module __main__: ENGINE
"""

from _serve import generate


class Engine:
    def __init__(self):
        self.history = []

    def serve(self, i):
        out = generate(i)
        self.history.append(out)
        return out.sequences.shape[-1]


ENGINE = Engine()
for i in range(12):
    ENGINE.serve(i)
print("history", len(ENGINE.history))
