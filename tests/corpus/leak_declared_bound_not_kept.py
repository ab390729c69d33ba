"""A hand-written prefix LRU declares ``maxsize = 4`` but trims only on a hit: with ever-new prompts it keeps
every cache. A declared bound the collection does not keep is judged by its sizes, not trusted.

expect: leak
holder: PrefixLRU._store
"""

from collections import OrderedDict

from _serve import prefill, prompt


class PrefixLRU:
    maxsize = 4

    def __init__(self):
        self._store = OrderedDict()

    def lookup(self, i):
        ids = prompt(i)
        key = f"p{i}"
        if key in self._store:
            self._store.move_to_end(key)
            while len(self._store) > self.maxsize:  # the bug: trimmed only on a hit
                self._store.popitem(last=False)
            return self._store[key]
        self._store[key] = prefill(ids)
        return self._store[key]


LRU = PrefixLRU()
for i in range(16):
    LRU.lookup(i)
print("stored", len(LRU._store))
