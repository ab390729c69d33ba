"""A server with several holders at once - what the determinism test runs three times, once on a busy
machine: a linked history of chat turns (leak), an LRU of sessions that evicts (bounded), done asyncio
tasks kept in a set (leak), and the last output in a variable (bounded).

expect: leak
holder: module __main__: LAST_TURN
holder: module __main__: BACKGROUND
"""

import asyncio
from collections import OrderedDict

from _serve import generate


class Turn:
    def __init__(self, parent, output):
        self.parent = parent
        self.output = output


LAST_TURN = None
LRU = OrderedDict()
BACKGROUND = set()
LAST = None


async def handle(i):
    await asyncio.sleep(0)
    return generate(i)


async def main():
    global LAST_TURN, LAST
    for i in range(24):
        kind = i % 4
        if kind == 0:
            LAST_TURN = Turn(LAST_TURN, generate(i))
        elif kind == 1:
            LRU[f"s{i % 12}"] = generate(i)
            LRU.move_to_end(f"s{i % 12}")
            while len(LRU) > 2:
                LRU.popitem(last=False)
        elif kind == 2:
            task = asyncio.ensure_future(handle(i))
            BACKGROUND.add(task)
            await task
        else:
            LAST = generate(i)


asyncio.run(main())
print("served", 24)
