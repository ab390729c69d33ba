"""Chat turns linked by a parent pointer, but the chain is cut after three turns (older context dropped).

expect: clean
"""

from _serve import generate


class Turn:
    def __init__(self, parent, output):
        self.parent = parent
        self.output = output


def trim(turn, keep):
    node = turn
    for _ in range(keep - 1):
        if node.parent is None:
            return
        node = node.parent
    node.parent = None


LAST = None
for i in range(16):
    LAST = Turn(LAST, generate(i))
    trim(LAST, 3)
print("kept", 3)
