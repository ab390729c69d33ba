"""A chat 'server' for bench/run_overhead.py: N requests on a tiny random-weight Llama (prompts of 24-40
tokens, 16 new tokens each). ``leak``: every output is kept in a session dict (N ended requests with their
KV at exit: the audit's worst case); ``clean``: an OrderedDict LRU of 4 sessions.

    python bench/programs/chat_server.py 100 leak
"""

import sys
from collections import OrderedDict

import torch

from kvguardian.apps.repro.models import TINY, build_llama

MODEL = build_llama(TINY)
SESSIONS = {}
LRU = OrderedDict()


def handle(i, mode):
    ids = torch.randint(0, 100, (1, 24 + i % 17), generator=torch.Generator().manual_seed(i))
    out = MODEL.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                         return_dict_in_generate=True)
    if mode == "leak":
        SESSIONS[f"s{i}"] = out
    else:
        LRU[f"s{i % 9}"] = out
        LRU.move_to_end(f"s{i % 9}")
        while len(LRU) > 4:
            LRU.popitem(last=False)


if __name__ == "__main__":
    n, mode = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "leak"
    for i in range(n):
        handle(i, mode)
    print("served", n, mode)
