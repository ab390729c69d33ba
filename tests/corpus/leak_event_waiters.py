"""An asyncio server whose per-request follow-up tasks wait on a global shutdown Event, each holding its
request's output in a local; the loop stays open (the server is still up) when the program ends.

expect: leak
holder: module __main__: SHUTDOWN
"""

import asyncio

from _serve import generate

SHUTDOWN = None


async def follow_up(out):
    await SHUTDOWN.wait()
    return out.sequences.shape


async def main(n):
    global SHUTDOWN
    SHUTDOWN = asyncio.Event()
    for i in range(n):
        asyncio.ensure_future(follow_up(generate(i)))  # noqa: RUF006 - the shape under test
        await asyncio.sleep(0)
    print("served", n)


LOOP = asyncio.new_event_loop()
LOOP.run_until_complete(main(12))
