"""A "fine-tuning while serving" loop runs forwards with autograd on (a trainable adapter), so every KV
tensor carries its graph; the caches are kept for a later backward that never comes.

expect: leak
holder: module __main__: FOR_BACKWARD
"""

import torch
from transformers import DynamicCache

from _serve import MODEL, prompt
from kvguardian.runtime.hf.compat import cache_kwarg

adapter = torch.nn.Parameter(torch.zeros(MODEL.config.hidden_size))
MODEL.model.embed_tokens.register_forward_hook(lambda m, a, out: out + adapter)
FOR_BACKWARD = []
for i in range(6):
    cache = DynamicCache()
    ids = prompt(i)
    with torch.enable_grad():
        out = MODEL(ids, **{cache_kwarg(): cache}, use_cache=True)
        out = MODEL(ids[:, -1:], **{cache_kwarg(): cache}, use_cache=True)
    FOR_BACKWARD.append((cache, out.logits))
del cache, out
print("kept", len(FOR_BACKWARD))
