"""A transformers Llama's own weights, run with paged attention over a `PagedKVPool`.

Every step takes a ragged batch (prefills and decodes together): the new tokens of all sequences are
flattened, projected and rotated at once; each sequence's K/V is written into its slots of the pool, then
its whole context is gathered back through its block table and attended to. The weights, norms, rotary
embedding and MLP are the Hugging Face modules themselves, so greedy tokens can be compared with
``generate()`` on the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvguardian.runtime.paged.records import KVSpec

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM

    from kvguardian.runtime.paged.pool import PagedKVPool

__all__ = ["PagedLlama", "StepInput"]


@dataclass
class StepInput:
    """One sequence's share of a step."""

    request_id: str
    token_ids: list[int]  # the tokens computed this step (a prompt's uncached part, or one decode token)
    start: int  # position of token_ids[0]
    slots: np.ndarray  # int64 pool slots of those tokens (block * block_size + offset)
    block_ids: np.ndarray  # the sequence's block table as the engine sees it, token order


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PagedLlama:
    """Wraps a ``LlamaForCausalLM`` (not copied: its modules are reused as they are)."""

    def __init__(self, hf_model: LlamaForCausalLM) -> None:
        cfg = hf_model.config
        inner = hf_model.model
        self.config = cfg
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = hf_model.lm_head
        self.spec = KVSpec.from_config(cfg)
        self.heads = int(cfg.num_attention_heads)
        self.groups = self.heads // self.spec.kv_heads
        self.scaling = self.spec.head_dim ** -0.5

    def forward(self, pool: PagedKVPool, batch: list[StepInput]) -> Any:
        """Run one step; return the logits of each sequence's last new token, ``[len(batch), vocab]``."""
        import torch
        import torch.nn.functional as F

        with torch.inference_mode():
            lengths = [len(s.token_ids) for s in batch]
            tokens = torch.tensor([t for s in batch for t in s.token_ids], dtype=torch.long)  # [T]
            pos = torch.cat([torch.arange(s.start, s.start + n) for s, n in zip(batch, lengths)])  # [T]
            ends = np.cumsum(lengths)
            starts = ends - np.asarray(lengths)
            slots = [torch.from_numpy(np.ascontiguousarray(s.slots, dtype=np.int64)) for s in batch]
            tables = [torch.from_numpy(np.ascontiguousarray(s.block_ids, dtype=np.int64)) for s in batch]
            masks = []
            for s, n in zip(batch, lengths):  # query i (position start+i) sees keys 0..start+i
                ctx = s.start + n
                masks.append(None if n == 1 else
                             torch.arange(ctx)[None, :] <= torch.arange(s.start, ctx)[:, None])  # [n, ctx]
            x = self.embed(tokens)  # [T, hidden]
            cos, sin = self.rotary(x[None], pos[None])  # [1, T, D]
            cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [T, 1, D]
            hd, hkv = self.spec.head_dim, self.spec.kv_heads
            for li, layer in enumerate(self.layers):
                attn = layer.self_attn
                h = layer.input_layernorm(x)
                q = attn.q_proj(h).view(-1, self.heads, hd)  # [T, H, D]
                k = attn.k_proj(h).view(-1, hkv, hd)  # [T, H_kv, D]
                v = attn.v_proj(h).view(-1, hkv, hd)
                q = q * cos + _rotate_half(q) * sin
                k = k * cos + _rotate_half(k) * sin
                for i, s in enumerate(batch):  # every write of the layer before any read
                    pool.write(s.request_id, li, slots[i], k[starts[i]:ends[i]], v[starts[i]:ends[i]])
                outs = []
                for i, s in enumerate(batch):
                    ctx = s.start + lengths[i]
                    kc, vc = pool.gather(li, tables[i], ctx, request_id=s.request_id)  # [ctx, H_kv, D]
                    kc = kc.transpose(0, 1).repeat_interleave(self.groups, 0)  # [H, ctx, D]
                    vc = vc.transpose(0, 1).repeat_interleave(self.groups, 0)
                    qi = q[starts[i]:ends[i]].transpose(0, 1)  # [H, n, D]
                    o = F.scaled_dot_product_attention(qi, kc, vc, attn_mask=masks[i], scale=self.scaling)
                    outs.append(o.transpose(0, 1).reshape(lengths[i], -1))  # [n, H*D]
                x = x + attn.o_proj(torch.cat(outs))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            x = self.norm(x[torch.from_numpy(ends - 1)])  # [B, hidden]: each sequence's last token
            return self.lm_head(x)
