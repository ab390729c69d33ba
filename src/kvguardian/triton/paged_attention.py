"""Paged decode attention in Triton: one query token per sequence, K/V read through block tables.

Layout as in `kvguardian.runtime.paged.PagedKVPool`: per layer ``k_cache``/``v_cache`` ``[num_blocks, block_size,
kv_heads, head_dim]``; ``block_table`` ``[num_seqs, max_blocks]`` (int32/int64, token order);
``seq_lens`` ``[num_seqs]``; ``q`` ``[num_seqs, heads, head_dim]`` with ``heads = kv_heads * groups`` (GQA:
query head ``h`` reads KV head ``h // groups``). One program per (sequence, query head) walks the sequence's
blocks with an online softmax. Runs on a GPU, or on a CPU with ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:
    import torch

    from kvguardian.triton.sanitizer import SanitizedKernel

__all__ = ["paged_decode", "paged_decode_kernel"]


@triton.jit
def paged_decode_kernel(q, k_cache, v_cache, block_table, seq_lens, out, scale,
                        stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_os, stride_oh,
                        GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUPS
    seq_len = tl.load(seq_lens + seq)
    d = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    qv = tl.load(q + seq * stride_qs + head * stride_qh + d).to(tl.float32)  # [D]
    m = tl.full([1], float("-inf"), tl.float32)
    l_sum = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for i in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        block = tl.load(block_table + seq * stride_bt + i).to(tl.int64)
        live = i * BLOCK_SIZE + slots < seq_len  # [BS]
        kv_off = block * stride_kb + slots[:, None] * stride_ks + kv_head * stride_kh + d[None, :]  # [BS, D]
        k = tl.load(k_cache + kv_off, mask=live[:, None], other=0.0).to(tl.float32)
        s = tl.where(live, tl.sum(k * qv[None, :], axis=1) * scale, float("-inf"))  # [BS]
        m_new = tl.maximum(m, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_cache + kv_off, mask=live[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_sum = l_sum * alpha + tl.sum(p, axis=0)
        m = m_new
    tl.store(out + seq * stride_os + head * stride_oh + d, (acc / l_sum).to(out.dtype.element_ty))


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, *, scale: float | None = None,
                 kernel: SanitizedKernel | None = None) -> torch.Tensor:
    """Attention output ``[num_seqs, heads, head_dim]``; ``kernel`` may be a `sanitize`-d copy of the kernel."""
    import torch

    num_seqs, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of KV heads ({kv_heads})")
    out = torch.empty_like(q)
    k = kernel if kernel is not None else paged_decode_kernel
    k[(num_seqs, heads)](
        q, k_cache, v_cache, block_table, seq_lens, out, scale if scale is not None else head_dim ** -0.5,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        out.stride(0), out.stride(1), GROUPS=heads // kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
    )
    return out
