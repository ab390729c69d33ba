"""What every corpus program shares: a tiny random-weight Llama built locally (no download) and one request.

Each program in this folder is standalone (``python tests/corpus/leak_session_dict.py``) and is run by
``test_corpus.py`` under ``kv-guardian run``; its docstring says, after ``expect:``, whether it leaks and,
after each ``holder:``, a text every KVG102 warning or error chain of it names (one of them).
"""

import logging
import threading

import torch
from transformers import DynamicCache

from kvguardian.apps.repro.models import TINY, build_llama
from kvguardian.runtime.hf.compat import cache_kwarg, output_cache

__all__ = ["MODEL", "cache_of", "extend", "generate", "only_to", "prefill", "prompt", "serve_jobs"]

MODEL = build_llama(TINY)


def prompt(i, n=6):
    """A deterministic prompt of ``n + i % 5`` tokens."""
    return torch.randint(0, 100, (1, n + i % 5), generator=torch.Generator().manual_seed(i))


def generate(i, **kwargs):
    """One top-level ``generate()``: a request of its own under ``kv-guardian run``."""
    kwargs.setdefault("max_new_tokens", 3)
    return MODEL.generate(prompt(i), do_sample=False, return_dict_in_generate=True, **kwargs)


def cache_of(out):
    return output_cache(out)


def prefill(ids):
    """A manually driven cache (a request of its own, ended when the next one starts)."""
    cache = DynamicCache()
    with torch.no_grad():
        MODEL(ids, **{cache_kwarg(): cache}, use_cache=True)
    return cache


def extend(cache, prefix_ids, i):
    """Generate a question after a cached prefix (``cache`` holds ``prefix_ids``): a request that reuses it."""
    question = torch.randint(0, 100, (1, 4), generator=torch.Generator().manual_seed(1000 + i))
    return MODEL.generate(torch.cat([prefix_ids, question], 1), max_new_tokens=3, do_sample=False,
                          return_dict_in_generate=True, **{cache_kwarg(): cache})


def serve_jobs(worker, jobs, done, n, *, threads=2, name=None):
    """Start ``threads`` daemon ``worker`` threads (they stay alive waiting for work), put request numbers
    ``0..n-1`` on ``jobs`` and wait until each was released on ``done``."""
    for t in range(threads):
        threading.Thread(target=worker, daemon=True, name=f"{name}-{t}" if name else None).start()
    for i in range(n):
        jobs.put(i)
    for _ in range(n):
        done.acquire()
    print("served", n)


def only_to(name, handler, level):
    """The logger ``name``, sending its records at ``level`` and above to ``handler`` only."""
    log = logging.getLogger(name)
    log.setLevel(level)
    log.addHandler(handler)
    log.propagate = False
    return log
