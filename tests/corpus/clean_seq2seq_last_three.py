"""A translation service (encoder-decoder models: a T5 and a BART) keeps the generate() outputs of the last
three requests (each with its EncoderDecoderCache: self- and cross-attention KV) for a "retry" button, in an
OrderedDict trimmed to three. Bounded.

expect: clean
"""

from collections import OrderedDict

from _shapes import build_bart, build_t5, run_generate

MODELS = (build_t5(), build_bart())
RECENT = OrderedDict()

for i in range(12):
    RECENT[f"req-{i}"] = run_generate(MODELS[i % 2], i, max_new_tokens=4)
    while len(RECENT) > 3:
        RECENT.popitem(last=False)
print("recent", list(RECENT))
