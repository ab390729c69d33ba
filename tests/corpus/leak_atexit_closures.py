"""Each request registers an atexit handler to flush its output at shutdown; the atexit registry lives in
C, so no Python object holds the handlers - the chain must say so and name the closures.

expect: leak
holder: held from outside Python (C)
"""

import atexit

from _serve import generate


def handle(i):
    out = generate(i)

    def flush_on_exit():
        return out.sequences.shape

    atexit.register(flush_on_exit)


for i in range(10):
    handle(i)
print("registered", 10)
