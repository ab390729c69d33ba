"""A clean chat 'server': bounded retention only (run under `kv-guardian run`; it must stay silent).

Prefix caches of system prompts in a hand-written LRU (an OrderedDict, capacity 3, 6 prompts); a
functools.lru_cache(maxsize=2) of encoded greetings; a deque(maxlen=3) of recent caches for follow-ups; and
the last output kept in a module variable.
"""

import copy
import functools
import sys
from collections import OrderedDict, deque

import torch
from transformers import DynamicCache

from kvguardian.apps.repro.models import TINY, build_llama
from kvguardian.runtime.hf.compat import cache_kwarg, output_cache

MODEL = build_llama(TINY)
SYSTEM = [torch.randint(0, 100, (1, 8 + 2 * k), generator=torch.Generator().manual_seed(k)) for k in range(6)]
PREFIXES = OrderedDict()
CAPACITY = 3
RECENT = deque(maxlen=3)


def prefill(ids):
    cache = DynamicCache()
    with torch.no_grad():
        MODEL(ids, **{cache_kwarg(): cache}, use_cache=True)
    return cache


def prefix_cache(k):
    if k in PREFIXES:
        PREFIXES.move_to_end(k)
        return PREFIXES[k]
    cache = prefill(SYSTEM[k])
    PREFIXES[k] = cache
    while len(PREFIXES) > CAPACITY:
        PREFIXES.popitem(last=False)
    return cache


@functools.lru_cache(maxsize=2)
def greeting(k):
    return prefill(SYSTEM[k][:, :4])


def handle(i):
    k = (i * 5) % len(SYSTEM)
    cache = copy.deepcopy(prefix_cache(k))
    question = torch.randint(0, 100, (1, 4), generator=torch.Generator().manual_seed(100 + i))
    out = MODEL.generate(torch.cat([SYSTEM[k], question], 1), max_new_tokens=3, do_sample=False,
                         return_dict_in_generate=True, **{cache_kwarg(): cache})
    greeting(i % 3)
    RECENT.append(output_cache(out))
    return out


if __name__ == "__main__":
    last = None
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 18):
        last = handle(i)
    print("served", last.sequences.shape[-1])
