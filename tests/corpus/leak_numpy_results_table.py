"""Outputs stored in a preallocated numpy array of objects (a "results table" for a batch report) that is
never cleared. numpy does not show an object array's items to the garbage collector.

expect: leak
holder: module __main__: RESULTS
"""

import numpy as np

from _serve import generate

RESULTS = np.empty(64, dtype=object)
for i in range(20):
    RESULTS[i] = generate(i)
print("stored", sum(r is not None for r in RESULTS))
