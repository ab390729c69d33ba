"""A plugin system makes one handler class per request with type() and registers it by name; each class
dict keeps its request's output. The classes are made at run time, so they are not roots: the registry is.

expect: leak
holder: module __main__: HANDLERS
"""

from _serve import generate

HANDLERS = {}

for i in range(20):
    cls = type(f"Handler{i}", (), {"output": generate(i)})
    HANDLERS[cls.__name__] = cls
print(len(HANDLERS), "handlers")
