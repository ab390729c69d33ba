"""Streaming responses as generators; a client that disconnects leaves its stream suspended in the
server's list of open streams, and the generator's frame holds the whole output.

expect: leak
holder: module __main__: OPEN_STREAMS
"""

from _serve import generate

OPEN_STREAMS = []


def stream(i):
    out = generate(i)
    yield from out.sequences[0].tolist()


for i in range(12):
    s = stream(i)
    next(s)  # the client read one token and went away
    OPEN_STREAMS.append(s)
del s
print("open", len(OPEN_STREAMS))
