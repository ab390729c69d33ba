"""A program that leaks KV in a dict keyed by the prompt text (canary text planted by the test)."""

import sys

import torch

from kvguardian.apps.repro.models import TINY, build_llama

MODEL = build_llama(TINY)
MEMO = {}  # prompt text -> cache: a leak whose dict key is tenant data


def handle(prompt):
    ids = torch.tensor([[3 + b % 120 for b in prompt.encode()]])
    out = MODEL.generate(ids, max_new_tokens=2, do_sample=False, return_dict_in_generate=True)
    MEMO[prompt] = out.past_key_values
    print(f"served {len(prompt)} characters")


for p in sys.argv[1:]:
    handle(p)
