"""A mutable default argument used as a "seen outputs" accumulator: the function's defaults hold a list
that grows with every call.

expect: leak
holder: function record() defaults
"""

from _serve import generate


def record(out, _seen=[]):  # noqa: B006 - the bug under test
    _seen.append(out)
    return len(_seen)


for i in range(12):
    record(generate(i))
print("recorded", 12)
