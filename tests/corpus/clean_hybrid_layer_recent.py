"""A server on a hybrid-attention model (Gemma2-style ``layer_types``: sliding-window and full-attention
layers in one cache) keeps the last two outputs in a ``deque(maxlen=2)``. Bounded.

expect: clean
"""

from collections import deque

from _shapes import build_hybrid, run_generate

MODEL = build_hybrid(window=4)
RECENT = deque(maxlen=2)

for i in range(12):
    RECENT.append(run_generate(MODEL, i, max_new_tokens=6))
print("recent", len(RECENT))
