"""Generates, prints, then crashes (or exits with a given code, or skips exit handlers)."""

import os
import sys

import torch

from kvguardian.apps.repro.models import TINY, build_llama

model = build_llama(TINY)
out = model.generate(torch.ones(1, 5, dtype=torch.long), max_new_tokens=2, do_sample=False)
print("generated", out.shape[-1])
mode = sys.argv[1] if len(sys.argv) > 1 else "crash"
if mode == "crash":
    raise SystemError("the program's own crash")
if mode == "code":
    sys.exit(7)
if mode == "os_exit":
    sys.stdout.flush()
    os._exit(0)
