"""Background tasks kept in a set with add_done_callback(set.discard), as the asyncio docs recommend.

expect: clean
"""

import asyncio

from _serve import generate

BACKGROUND_TASKS = set()


async def handle(i):
    await asyncio.sleep(0)
    return int(generate(i).sequences.shape[-1])


async def main():
    for i in range(12):
        task = asyncio.ensure_future(handle(i))
        BACKGROUND_TASKS.add(task)
        task.add_done_callback(BACKGROUND_TASKS.discard)
        await asyncio.sleep(0.001)
    while BACKGROUND_TASKS:
        await asyncio.sleep(0.01)


asyncio.run(main())
print("left", len(BACKGROUND_TASKS))
