"""Post-processing coroutines are created for every output but never awaited (the scheduler was never
started); each coroutine object holds its arguments.

expect: leak
holder: module __main__: BACKLOG
"""

import warnings

from _serve import generate

warnings.simplefilter("ignore", RuntimeWarning)  # "coroutine was never awaited" at exit
BACKLOG = []


async def postprocess(out):
    return out.sequences.shape


for i in range(12):
    BACKLOG.append(postprocess(generate(i)))
print("backlog", len(BACKLOG))
