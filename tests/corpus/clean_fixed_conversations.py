"""Three long-lived chat sessions (a fixed set of users), each turn continuing the user's own DynamicCache
(its earlier storages are replaced, the cache object lives on). The dict holds three caches all run, and
retained KV grows turn by turn as the conversations get longer: bounded, not a leak.

expect: clean
"""

import torch
from transformers import DynamicCache

from _serve import MODEL, prompt
from kvguardian.runtime.hf.compat import cache_kwarg


class Session:
    def __init__(self):
        self.cache = DynamicCache()
        self.history = torch.zeros((1, 0), dtype=torch.long)

    def turn(self, i):
        ids = torch.cat([self.history, prompt(i, 2)], 1)
        out = MODEL.generate(ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                             **{cache_kwarg(): self.cache})
        self.history = out.sequences


SESSIONS = {name: Session() for name in ("ana", "ben", "cy")}
for i in range(24):
    SESSIONS[("ana", "ben", "cy")[i % 3]].turn(i)
print({name: s.history.shape[1] for name, s in SESSIONS.items()})
