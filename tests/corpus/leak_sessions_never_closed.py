"""Twin of clean_fixed_conversations: every user's session continues its own cache for two turns, then the
user leaves - and the session is never closed: the dict gains a session (and its cache) every two requests.

expect: leak
holder: module __main__: SESSIONS
"""

import torch
from transformers import DynamicCache

from _serve import MODEL, prompt
from kvguardian.runtime.hf.compat import cache_kwarg

SESSIONS = {}
for i in range(24):
    fresh = {"cache": DynamicCache(), "history": torch.zeros((1, 0), dtype=torch.long)}
    s = SESSIONS.setdefault(f"user-{i // 2}", fresh)
    ids = torch.cat([s["history"], prompt(i, 2)], 1)
    s["history"] = MODEL.generate(ids, max_new_tokens=3, do_sample=False, **{cache_kwarg(): s["cache"]})
print("sessions", len(SESSIONS))
