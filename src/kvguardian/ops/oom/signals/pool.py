"""Occupancy of a paged KV pool: blocks holding KV (referenced, or cached for a later prefix hit) over its
capacity. This is the article's "KV usage" whose first remedy is evicting the LRU prefix cache; vLLM's
``kv_cache_usage_perc`` (referenced blocks only) is reported beside it (``extra["referenced"]``).

A pool preallocates its K/V tensors, so its occupancy is not host or GPU memory: evicting its prefix cache
lowers this signal (and a KV budget the ledger counts the blocks against), never the cgroup. In bytes when
the pool holds K/V tensors, in blocks otherwise. One read is a few numpy calls (docs/design/oom.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvguardian.ops.oom.signals.base import Reading, failed

if TYPE_CHECKING:
    from kvguardian.runtime.paged import PagedKVPool

__all__ = ["PoolSignal"]


def _blocks(pool: PagedKVPool) -> tuple[int, int]:
    """(referenced, cached and unreferenced) blocks."""
    bp = pool.blocks
    try:
        return pool.num_blocks - bp.num_available, int(np.count_nonzero(bp.cached & (bp.ref == 0)))
    except AttributeError:  # another block-pool layout: the pool's own (slower) metrics
        m = pool.metrics()
        return int(m["blocks_referenced"]), int(m["blocks_cached"])


class PoolSignal:
    fast = False

    def __init__(self, pool: PagedKVPool, *, name: str = "main") -> None:
        self.pool = pool
        self.name = f"pool:{name}"
        self.unit = "bytes" if getattr(pool, "block_bytes", 0) else "blocks"

    def __repr__(self) -> str:
        return f"<PoolSignal {self.name}>"

    def read(self) -> Reading:
        try:
            pool = self.pool
            referenced, cached = _blocks(pool)
            size = pool.block_bytes or 1
            return Reading(self.name, (referenced + cached) * size, pool.num_blocks * size, self.name, self.unit,
                           extra={"referenced": referenced * size, "cached": cached * size})
        except Exception as exc:
            return failed(self.name, self.name, exc, self.unit)
