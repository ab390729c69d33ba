"""Completion callbacks are queued as functools.partial(callback, output) in a pending dict that is only
drained for requests that succeed - these never do.

expect: leak
holder: module __main__: PENDING
"""

import functools

from _serve import generate

PENDING = {}


def notify(request_id, out):
    return request_id, out.sequences.shape


for i in range(12):
    PENDING[f"req-{i}"] = functools.partial(notify, f"req-{i}", generate(i))
print("pending", len(PENDING))
