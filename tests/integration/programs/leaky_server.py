"""A chat 'server' with four KV leaks kv-guardian has no special knowledge of (run under `kv-guardian run`).

Each request takes one of four paths; each path leaks its cache a different way:
a kept traceback, an unbounded memo of caches, closures in a global hook list, a module-level session dict.
"""

import sys

import torch

from kvguardian.apps.repro.models import TINY, build_llama

MODEL = build_llama(TINY)
FAILURES = []  # (type, value, traceback) of failed requests, "for the error page"
MEMO = {}  # prompt key -> cache, "to skip recomputation" (never evicted)
ON_SHUTDOWN = []  # hooks run at shutdown; each closes over its request's cache
SESSIONS = {}  # session id -> {"cache": ..., "turns": ...}


def generate(i):
    ids = torch.randint(0, 100, (1, 6 + i % 5), generator=torch.Generator().manual_seed(i))
    return MODEL.generate(ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)


def handle_failing(i):
    out = generate(i)
    cache = out.past_key_values
    raise RuntimeError(f"downstream rejected request {i} ({len(cache.layers)} layers)")


def handle(i):
    path = i % 4
    if path == 0:
        try:
            handle_failing(i)
        except RuntimeError:
            FAILURES.append(sys.exc_info())
        return
    out = generate(i)
    cache = out.past_key_values
    if path == 1:
        MEMO[f"prompt-{i}"] = cache
    elif path == 2:
        ON_SHUTDOWN.append(lambda: print("closing", len(cache.layers)))
    else:
        SESSIONS[f"s{i}"] = {"cache": cache, "turns": 1}


if __name__ == "__main__":
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 16):
        handle(i)
    print(f"served; failures={len(FAILURES)} memo={len(MEMO)} hooks={len(ON_SHUTDOWN)} sessions={len(SESSIONS)}")
