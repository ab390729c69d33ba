"""Tracing: every request object has 1,200 span objects pointing back at it (more back-references in all than
the holder search's budget of objects), and the app keeps every request in its history.

expect: leak
holder: module __main__: APP
"""

from _serve import generate


class Span:
    __slots__ = ("n", "request")

    def __init__(self, request, n):
        self.request = request
        self.n = n


class Request:
    def __init__(self, i):
        self.output = generate(i)
        self.spans = [Span(self, n) for n in range(1200)]


class App:
    def __init__(self):
        self.history = []


APP = App()
for i in range(24):
    APP.history.append(Request(i))
print("requests", len(APP.history))
