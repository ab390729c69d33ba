"""The sweep's adapter for the paged KV pool (`kvguardian.runtime.paged`, when installed): attention whose K/V go
through the pool's blocks.

``paged_attention(q, k, v, is_causal=True)`` has SDPA's ``bhsd`` signature. For each sequence of the batch it
opens a block table, appends ``seq`` slots (allocating blocks), writes K and V into the pool's preallocated
tensors, gathers them back through the block table, attends with SDPA, and frees the table. The pool is
created once per shape and grown (recreated) when a longer sequence needs more blocks; that happens in the
sweep's warm-up call, before its baseline. After every call the adapter checks that all blocks came back
(the pool's own conservation: a lost free would keep memory without allocating any), and raises if not.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from kvguardian.runtime.paged import PagedKVPool

__all__ = ["BLOCK_SIZE", "available", "paged_attention"]

BLOCK_SIZE = 16
_POOLS: dict[tuple[Any, ...], Any] = {}  # (kv_heads, head_dim, dtype, device) -> PagedKVPool
_ids = itertools.count(1)


def available() -> bool:
    """True when `kvguardian.runtime.paged` provides the pool this adapter drives."""
    try:
        from kvguardian.runtime.paged import KVSpec, PagedKVPool  # noqa: F401
    except ImportError:
        return False
    return True


def _pool(h: int, d: int, dtype: torch.dtype, device: torch.device, blocks: int) -> PagedKVPool:
    from kvguardian.runtime.paged import KVSpec, PagedKVPool

    key = (h, d, str(dtype), str(device))
    pool = _POOLS.get(key)
    if pool is None or pool.num_blocks < blocks:
        spec = KVSpec(num_layers=1, kv_heads=h, head_dim=d, dtype=str(dtype).replace("torch.", ""),
                      device=str(device))
        pool = _POOLS[key] = PagedKVPool(max(blocks, 2 * (pool.num_blocks if pool else 0)), BLOCK_SIZE, spec,
                                         prefix_caching=False)
    return pool


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """``[B, H, S, D]`` attention with K/V stored in and gathered from the paged pool's blocks."""
    import torch
    import torch.nn.functional as F

    b, h, s, d = q.shape
    pool = _pool(h, d, q.dtype, q.device, b * -(-s // BLOCK_SIZE) + 1)
    before = pool.blocks.num_available
    outs = []
    for i in range(b):
        rid = f"sweep-{next(_ids)}"
        pool.open(rid, "sweep")
        try:
            slots = torch.from_numpy(pool.append(rid, [0] * s)).to(q.device)
            pool.write(rid, 0, slots, k[i].transpose(0, 1), v[i].transpose(0, 1))  # [S, H, D]
            table = torch.from_numpy(pool.block_ids(rid).astype("int64")).to(q.device)
            kc, vc = pool.gather(0, table, s)  # [S, H, D]
            outs.append(F.scaled_dot_product_attention(q[i:i + 1], kc.transpose(0, 1)[None], vc.transpose(0, 1)[None],
                                                       is_causal=is_causal))
        finally:
            pool.free(rid)
    after = pool.blocks.num_available
    if after != before:
        raise RuntimeError(f"paged pool lost blocks in one call: {before} available before, {after} after")
    return torch.cat(outs)
