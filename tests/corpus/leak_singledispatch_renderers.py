"""A ``functools.singledispatch`` renderer gains a per-request response type and an implementation closing
over the request's output (plugins registered at run time, never unregistered).

expect: leak
holder: module __main__: render
"""

import functools

from _serve import generate


@functools.singledispatch
def render(response):
    return str(response)


def handle(i):
    out = generate(i)
    response_type = type(f"Response{i}", (), {})
    render.register(response_type)(lambda response, out=out: out.sequences.tolist())


for i in range(12):
    handle(i)
print("renderers", len(render.registry))
