"""A Starlette-style ``app.state`` namespace: each request stores its output as a new attribute named after
the request (``setattr(app.state, f"req_{i}", out)``); nothing deletes them.

expect: leak
holder: module __main__: APP
"""

from _serve import generate


class State:
    pass


class App:
    def __init__(self):
        self.state = State()


APP = App()
for i in range(24):
    setattr(APP.state, f"req_{i}", generate(i))
print("attributes", sum(hasattr(APP.state, f"req_{i}") for i in range(24)))  # vars() would materialise the dict
