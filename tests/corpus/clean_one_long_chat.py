"""One live conversation: every turn continues the same DynamicCache, so the KV kept between turns grows
with the context (one cache, 24 turns). Not a leak: one session, continued by every request.

expect: clean
"""

import torch
from transformers import DynamicCache

from _serve import MODEL, prompt
from kvguardian.runtime.hf.compat import cache_kwarg

CACHE = DynamicCache()
history = torch.zeros((1, 0), dtype=torch.long)
for turn in range(24):
    ids = torch.cat([history, prompt(turn, 2)], 1)
    out = MODEL.generate(ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                         **{cache_kwarg(): CACHE})
    history = out.sequences
del out
print("context", history.shape[1])
