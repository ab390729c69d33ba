"""Failed requests go to an unbounded retry deque with their partial output; no retry worker runs.

expect: leak
holder: module __main__: RETRY
"""

from collections import deque

from _serve import generate

RETRY = deque()
for i in range(12):
    out = generate(i)
    if i % 3 != 2:
        RETRY.append(("timeout", out))
del out
print("retries", len(RETRY))
