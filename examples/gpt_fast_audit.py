"""Audit a gpt-fast-style model (KV buffers preallocated on its attention modules) with kv-guardian.

    .venv/bin/python examples/gpt_fast_audit.py           # clean: accounting and lifecycle, no finding
    .venv/bin/python examples/gpt_fast_audit.py --leak    # re-creates the caches per request and keeps
                                                          # the old ones "for reuse": KVG102 + holder chain

The model is a few lines of torch in the style of gpt-fast's model.py (random weights, CPU). kv-guardian
finds the buffers through ``model.modules()`` (`Guard.track_module`), observes them after each forward
(O(layers): the same storages every step), declares the ones the model holds retained, and reports the
static-cache fill (allocated vs filled = fragmentation) per layer.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn
from torch.nn import functional as F

import kvguardian as kvg


class KVCache(nn.Module):
    def __init__(self, batch: int, heads: int, max_len: int, head_dim: int) -> None:
        super().__init__()
        shape = (batch, heads, max_len, head_dim)  # k/v: [B, H_kv, S_max, D]
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def update(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k_cache[:, :, pos] = k  # k: [B, H_kv, T, D], written in place
        self.v_cache[:, :, pos] = v
        return self.k_cache, self.v_cache


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).view(b, t, 3, self.heads, self.head_dim).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [B, H, T, D]
        assert self.kv_cache is not None, "call setup_caches() first"
        k, v = self.kv_cache.update(pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention = Attention(dim, heads)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x, pos, mask)
        return x + self.ffn(x)


class Transformer(nn.Module):
    def __init__(self, vocab: int = 128, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.dim, self.heads = dim, heads
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.out = nn.Linear(dim, vocab, bias=False)
        self.max_len = 0

    def setup_caches(self, batch: int, max_len: int) -> None:
        self.max_len = max_len
        for blk in self.layers:
            blk.attention.kv_cache = KVCache(batch, self.heads, max_len, self.dim // self.heads)

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(self.max_len, self.max_len, dtype=torch.bool).tril()[input_pos]
        x = self.embed(idx)
        for blk in self.layers:
            x = blk(x, input_pos, mask)
        return self.out(x)


@torch.inference_mode()
def generate(model: Transformer, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    t = prompt.shape[-1]
    logits = model(prompt, torch.arange(t))
    tokens = [logits[:, -1].argmax(-1, keepdim=True)]
    for i in range(new_tokens - 1):
        logits = model(tokens[-1], torch.tensor([t + i]))
        tokens.append(logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, -1)


OLD_CACHES: list[KVCache] = []  # the --leak bug: replaced caches kept "for reuse", never reused


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leak", action="store_true", help="keep every replaced cache in a module-level list")
    ap.add_argument("--requests", type=int, default=4)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = Transformer().eval()
    model.setup_caches(batch=1, max_len=64)
    guard = kvg.Guard()
    guard.track_module(model, positions="input_pos")  # finds k_cache/v_cache via model.modules()
    for i in range(args.requests):
        if args.leak and i:  # "grow the context window": new caches; the old ones are kept
            OLD_CACHES.extend(blk.attention.kv_cache for blk in model.layers)
            model.setup_caches(batch=1, max_len=64 + 16 * i)
        with guard.request(f"r{i}", tenant="demo"):
            generate(model, torch.randint(0, 128, (1, 8 + i)), new_tokens=6)
    report = guard.check()
    kv = report.summary["kv"]
    print(json.dumps({"findings": {k: len(report.by_id(k)) for k in sorted(report.ids())},
                      "worst": report.worst().value if report.worst() else None,
                      "static": kv["static"], "by_layer": kv["by_layer"],
                      "events": report.summary["events"]}, indent=2))
    for f in report.findings:
        print(f"{f.id} ({f.severity.value}) {f.message}", file=sys.stderr)
        if f.holder_chain:
            print("  held by: " + f.render_chain(), file=sys.stderr)
    return report.exit_code("error")


if __name__ == "__main__":
    raise SystemExit(main())
