"""A server on a hybrid-attention model (Gemma2-style ``layer_types``: a sliding-window layer and a
full-attention layer in one cache) appends every output to a history list "for evaluation later".

expect: leak
holder: module __main__: HISTORY
"""

from _shapes import build_hybrid, run_generate

MODEL = build_hybrid(window=4)
HISTORY = []

for i in range(10):
    HISTORY.append(run_generate(MODEL, i, max_new_tokens=6))
print("history", len(HISTORY))
