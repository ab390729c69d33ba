"""Each chat turn points to its parent turn and holds its own output; only the newest turn is in a global.

expect: leak
holder: module __main__: LAST_TURN
holder: Turn.parent
"""

from _serve import generate


class Turn:
    def __init__(self, parent, output):
        self.parent = parent
        self.output = output


LAST_TURN = None
for i in range(14):
    LAST_TURN = Turn(LAST_TURN, generate(i))
print("turns", 14)
