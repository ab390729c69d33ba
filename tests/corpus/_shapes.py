"""What the corpus programs of other cache shapes share: tiny random-weight models of those shapes, built from a
config (never downloaded; hidden size 32, 2 layers, so each program runs in seconds), and one request.

Speculative decoding (a 4-layer model and its 1-layer draft, one vocabulary), encoder-decoder (T5, BART),
sliding-window (Mistral-style) and hybrid (Gemma2 ``layer_types``) models: `kvguardian.apps.repro.models`.
"""

import dataclasses

import torch

from kvguardian.apps.repro.models import DRAFT, build_bart, build_hybrid, build_llama, build_sliding, build_t5

__all__ = ["build_bart", "build_hybrid", "build_sliding", "build_t5", "draft_llama", "ids", "park", "run_generate"]


def draft_llama(layers=2):
    """A Llama of the `DRAFT` shape with ``layers`` layers: a main model and its assistant share a vocabulary."""
    return build_llama(dataclasses.replace(DRAFT, layers=layers))


def ids(i, n=6):
    """A deterministic prompt of ``n + i % 4`` tokens (ids 2..59: no special token)."""
    return torch.randint(2, 60, (1, n + i % 4), generator=torch.Generator().manual_seed(i))


def run_generate(model, i, **kwargs):
    """One top-level ``generate()`` (a request of its own under ``kv-guardian run``), greedy, 3 new tokens."""
    kwargs.setdefault("max_new_tokens", 3)
    return model.generate(ids(i), do_sample=False, return_dict_in_generate=True, **kwargs)


def park(cache, dtype=torch.float16):
    """Move every layer of a finished request's cache to ``dtype`` (``layer.keys = layer.keys.to(...)``, what a
    device move does to a layer), to keep it smaller for a later resume; returns the cache."""
    for layer in cache.layers:
        layer.keys = layer.keys.to(dtype)
        layer.values = layer.values.to(dtype)
    return cache
