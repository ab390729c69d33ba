"""KV remanence: a freed block still holds its previous owner's K/V until someone overwrites it.

A kernel that reads past a sequence's length then attends to another request's (or tenant's) K/V. Two opt-in
defences on `PagedKVPool`: ``scrub=`` zeroes reused blocks at allocation (on a tenant change, or always), and
``debug=True`` reports a read of a slot its owner never wrote as KVG211, scrubbed or not. Cost: ``bench/scrub.py``.
Details: docs/design/paged.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kvguardian.core.errors import UsageError
from kvguardian.runtime.paged.records import BlockTable

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["SCRUB_POLICIES", "Remanence"]

SCRUB_POLICIES = ("never", "on-tenant-change", "always")
_MAX_SLOTS_IN_EVIDENCE = 8


class KVStore(Protocol):
    """What scrubbing reads of the pool: its size and its K/V tensors (per layer, ``[blocks, slots, ...]``)."""

    num_blocks: int
    block_size: int
    kv: Any  # a KVSpec, or None for a bookkeeping-only pool
    k: list[Any]
    v: list[Any]


class Remanence:
    """Block ownership by tenant, scrubbing, and (debug) the per-slot written-since-allocation marks."""

    def __init__(self, pool: KVStore, policy: str, *, residue_check: bool) -> None:
        if policy not in SCRUB_POLICIES:
            raise UsageError(f"scrub must be one of {', '.join(SCRUB_POLICIES)}, got {policy!r}")
        self.pool = pool
        self.policy = policy
        n = pool.num_blocks
        self.owner = np.full(n, -1, dtype=np.int32)  # tenant code of the table that last claimed each block
        self.previous = np.full(n, -1, dtype=np.int32)  # the tenant before that (for findings)
        self._tenants: dict[str, int] = {}
        self._names: list[str] = []
        self.scrubbed_blocks = 0  # blocks zeroed so far
        self.tenant_changes = 0  # blocks that passed from one tenant to another
        layers = len(pool.k) if pool.kv is not None else 0
        self.written: np.ndarray | None = (
            np.zeros((layers, n * pool.block_size), dtype=bool) if residue_check and layers else None
        )

    def tenant_name(self, code: int) -> str | None:
        return self._names[code] if 0 <= code < len(self._names) else None

    def claim(self, table: BlockTable, ids: np.ndarray, copy_of: int | None = None) -> None:
        """Blocks ``ids`` were just allocated to ``table`` (``copy_of``: a copy-on-write of that block)."""
        code = self._tenants.get(table.tenant)
        if code is None:
            code = self._tenants[table.tenant] = len(self._names)
            self._names.append(table.tenant)
        before = self.owner.take(ids)
        changed = (before >= 0) & (before != code)
        self.tenant_changes += int(np.count_nonzero(changed))
        dirty = ids[changed] if self.policy == "on-tenant-change" else ids[before >= 0]
        if self.policy != "never" and len(dirty):
            self._zero(dirty)
        self.previous[ids] = before
        self.owner[ids] = code
        if self.written is not None:
            bs = self.pool.block_size
            slots = (ids.astype(np.int64)[:, None] * bs + np.arange(bs)).ravel()
            if copy_of is None:
                self.written[:, slots] = False
            else:  # the copy holds exactly what the original's producer wrote
                self.written[:, slots] = self.written[:, copy_of * bs:(copy_of + 1) * bs]

    def _zero(self, ids: np.ndarray) -> None:
        pool = self.pool
        if pool.kv is not None:
            import torch

            index = torch.from_numpy(ids.astype(np.int64)).to(pool.k[0].device)
            for layer in range(len(pool.k)):
                pool.k[layer].index_fill_(0, index, 0)
                pool.v[layer].index_fill_(0, index, 0)
        self.scrubbed_blocks += len(ids)

    def wrote(self, layer: int, slots: torch.Tensor | np.ndarray) -> None:
        if self.written is not None:
            s = slots.numpy() if hasattr(slots, "numpy") else np.asarray(slots)
            self.written[layer, s] = True

    def unwritten(self, layer: int, block_ids: torch.Tensor | np.ndarray, num_tokens: int) -> np.ndarray:
        """Slots among the first ``num_tokens`` of ``block_ids`` (token order) nobody wrote since allocation."""
        if self.written is None:
            return np.empty(0, dtype=np.int64)
        ids = (block_ids.numpy() if hasattr(block_ids, "numpy") else np.asarray(block_ids)).astype(np.int64)
        bs = self.pool.block_size
        slots = (ids[:, None] * bs + np.arange(bs)).ravel()[:num_tokens]
        return slots[~self.written[layer, slots]]

    def residue_evidence(self, slots: np.ndarray) -> dict[str, Any]:
        bs = self.pool.block_size
        block = int(slots[0] // bs)
        return {"slot": int(slots[0]), "slot_in_block": int(slots[0] % bs),
                "slots": [int(s) for s in slots[:_MAX_SLOTS_IN_EVIDENCE]], "slot_count": len(slots),
                "previous_tenant": self.tenant_name(int(self.previous[block])),
                "scrubbed": self.policy != "never"}
