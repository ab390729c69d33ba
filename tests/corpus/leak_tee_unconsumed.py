"""A stream of outputs split with itertools.tee for an audit branch that is never read: tee's C buffer keeps
every output the main branch has passed (the buffer has no Python-visible container, only its C links).

expect: leak
holder: module __main__: audit
"""

import itertools

from _serve import generate


def outputs():
    for i in range(20):
        yield generate(i)


served, audit = itertools.tee(outputs())
for _out in served:
    pass
print("served; audit branch pending")
