"""A translation service (encoder-decoder models: a T5 and a BART, each request to one of them) keeps every
request's generate() output by request id for an audit that never reads it: each output holds an
EncoderDecoderCache, the decoder's self-attention KV and the cross-attention KV of the encoded source.

expect: leak
holder: module __main__: RESULTS
"""

from _shapes import build_bart, build_t5, run_generate

MODELS = (build_t5(), build_bart())
RESULTS = {}

for i in range(10):
    RESULTS[f"req-{i}"] = run_generate(MODELS[i % 2], i, max_new_tokens=4)
print("results", len(RESULTS))
