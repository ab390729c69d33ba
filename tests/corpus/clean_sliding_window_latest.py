"""A chat server on a sliding-window model (Mistral-style, ``sliding_window=4``) keeps only the latest
request's output (cache included) for a debug endpoint: one at a time.

expect: clean
"""

from _shapes import build_sliding, run_generate

MODEL = build_sliding(window=4)
LATEST = None

for i in range(10):
    LATEST = run_generate(MODEL, i, max_new_tokens=6)
print("latest", LATEST.sequences.shape)
