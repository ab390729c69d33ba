"""A speculative-decoding server (``generate(assistant_model=...)``) records every draft forward's output for an
acceptance-rate dashboard that was never built: a forward hook on the draft model appends each output, which
holds the assistant's cache (its KV of that request), to a module-level list.

expect: leak
holder: module __main__: DRAFT_OUTPUTS
"""

from _shapes import draft_llama, run_generate

MAIN = draft_llama(layers=4)
DRAFT = draft_llama(layers=1)
DRAFT_OUTPUTS = []


def record(module, args, output):
    DRAFT_OUTPUTS.append(output)


DRAFT.register_forward_hook(record)
for i in range(8):
    run_generate(MAIN, i, assistant_model=DRAFT, max_new_tokens=4)
print("draft forwards kept", len(DRAFT_OUTPUTS))
