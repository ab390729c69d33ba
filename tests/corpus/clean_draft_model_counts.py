"""A speculative-decoding server (``generate(assistant_model=...)``) counts the draft model's forwards and the
tokens it proposed, from a forward hook on the draft model: only integers are kept, and only the generated
token ids of each request are returned to the client.

expect: clean
"""

from collections import Counter

from _shapes import draft_llama, run_generate

MAIN = draft_llama(layers=4)
DRAFT = draft_llama(layers=1)
STATS = Counter()


def count(module, args, output):
    STATS["forwards"] += 1
    STATS["proposed"] += int(output.logits.shape[1])


DRAFT.register_forward_hook(count)
REPLIES = [run_generate(MAIN, i, assistant_model=DRAFT, max_new_tokens=4).sequences[0].tolist() for i in range(8)]
print("stats", dict(STATS), "replies", len(REPLIES))
