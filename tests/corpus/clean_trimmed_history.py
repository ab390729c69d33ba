"""A conversation history list trimmed to its last four outputs after every turn.

expect: clean
"""

from _serve import generate

HISTORY = []
for i in range(18):
    HISTORY.append(generate(i))
    del HISTORY[:-4]
print("history", len(HISTORY))
