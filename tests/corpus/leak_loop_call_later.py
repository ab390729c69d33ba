"""A background event-loop thread schedules each request's cleanup an hour later with call_later; the
TimerHandles (and the outputs passed as their arguments) wait in the loop's schedule.

expect: leak
holder: _scheduled
"""

import asyncio
import threading

from _serve import generate

LOOP = asyncio.new_event_loop()
threading.Thread(target=LOOP.run_forever, daemon=True, name="events").start()


def release_later(out):
    out.clear()


for i in range(12):
    out = generate(i)
    LOOP.call_soon_threadsafe(LOOP.call_later, 3600, release_later, out)
del out
asyncio.run_coroutine_threadsafe(asyncio.sleep(0), LOOP).result()
print("scheduled", len(LOOP._scheduled))
