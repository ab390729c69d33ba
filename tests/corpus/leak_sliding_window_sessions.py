"""A chat server on a sliding-window model (Mistral-style, ``sliding_window=4``: every layer a
DynamicSlidingWindowLayer) keeps each session's generate() output, cache included, for a resume that never
comes; sessions are never closed.

expect: leak
holder: module __main__: SESSIONS
"""

from _shapes import build_sliding, run_generate

MODEL = build_sliding(window=4)
SESSIONS = {}

for i in range(10):
    SESSIONS[f"user-{i}"] = run_generate(MODEL, i, max_new_tokens=6)
print("sessions", len(SESSIONS))
