"""A contextvar holds a per-context request log; the server never runs requests in their own context, so
one list in the main context collects every output.

expect: leak
holder: contextvar request_log
"""

import contextvars

from _serve import generate

request_log = contextvars.ContextVar("request_log")
request_log.set([])


def handle(i):
    request_log.get().append(generate(i))


for i in range(12):
    handle(i)
print("logged", len(request_log.get()))
