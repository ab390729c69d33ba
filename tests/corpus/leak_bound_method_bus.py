"""An event bus keeps subscribers as bound methods; every request handler subscribes itself (with its
output) and never unsubscribes.

expect: leak
holder: module __main__: BUS
"""

from _serve import generate


class EventBus:
    def __init__(self):
        self.subscribers = []

    def subscribe(self, fn):
        self.subscribers.append(fn)


class Handler:
    def __init__(self, i):
        self.output = generate(i)

    def on_config_change(self, cfg):
        return cfg


BUS = EventBus()
for i in range(12):
    BUS.subscribe(Handler(i).on_config_change)
print("subscribers", len(BUS.subscribers))
