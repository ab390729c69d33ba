"""Streaming responses as generators, each consumed to the end (or closed) by its client.

expect: clean
"""

from _serve import generate


def stream(i):
    out = generate(i)
    yield from out.sequences[0].tolist()


total = 0
for i in range(12):
    s = stream(i)
    if i % 3 == 0:
        next(s)
        s.close()  # client disconnected: the server closes the stream
    else:
        total += sum(1 for _ in s)
print("tokens", total)
