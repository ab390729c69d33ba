"""The asyncio docs' pattern - keep a reference to background tasks in a set - without the discard: every
done task stays in the set, and its result (the output) with it. CPython 3.11 does not show a task's
result to gc.get_referrers.

expect: leak
holder: module __main__: BACKGROUND_TASKS
"""

import asyncio

from _serve import generate

BACKGROUND_TASKS = set()


async def handle(i):
    await asyncio.sleep(0)
    return generate(i)


async def main():
    for i in range(12):
        task = asyncio.ensure_future(handle(i))
        BACKGROUND_TASKS.add(task)  # no task.add_done_callback(BACKGROUND_TASKS.discard)
        await asyncio.sleep(0.001)
    await asyncio.gather(*BACKGROUND_TASKS)


asyncio.run(main())
print("tasks", len(BACKGROUND_TASKS))
