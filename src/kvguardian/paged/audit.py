"""The full audit of a paged pool, vectorised with numpy: `PagedKVPool.check_invariants()` calls `audit`.

Invariants, each recomputed from an independent record:

1. conservation (SGLang's checker in spirit): free + cached-unreferenced (counted in the free queue) +
   referenced (counted from the ref counts) == total, with no block queued twice (KVG206);
2. no block both free and referenced, and no unreferenced block missing from the free queue (KVG206);
3. ref count == references from live block tables, counted from the tables (KVG203; below zero: KVG201);
4. no table closed while holding blocks (lost free, KVG204);
5. every table listing a block is of the namespace the block's contents were written in, so no block is in
   the tables of two tenants without a shared namespace (KVG205);
6. the prefix index and the per-block cached flags agree (KVG206).

One finding per violated invariant, with counts and the first blocks and requests as evidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kvguardian._errors import InternalError
from kvguardian.findings import Finding, Severity

if TYPE_CHECKING:  # pragma: no cover
    from kvguardian.paged.pool import PagedKVPool
    from kvguardian.paged.records import BlockTable

__all__ = ["audit", "table_references"]

_SHOW = 16


def table_references(tables: list[BlockTable], num_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(every block id listed by ``tables``, the lister's namespace code for each, references per block)."""
    if not tables:
        empty = np.empty(0, dtype=np.int32)
        return empty, empty, np.zeros(num_blocks, dtype=np.int64)
    blocks = np.concatenate([t.blocks[: t.num_blocks] for t in tables])
    lengths = np.fromiter((t.num_blocks for t in tables), dtype=np.int64, count=len(tables))
    ns = np.repeat(np.fromiter((t.ns_code for t in tables), dtype=np.int32, count=len(tables)), lengths)
    return blocks, ns, np.bincount(blocks, minlength=num_blocks)


def audit(pool: PagedKVPool) -> list[Finding]:
    """Every invariant of ``pool`` at once; an empty list means the pool is consistent."""
    bp = pool.blocks
    n = pool.num_blocks
    ref = bp.ref
    tables = list(pool._tables.values())
    closed = list(pool._closed.values())
    live_blocks, live_ns, live_refs = table_references(tables, n)
    closed_refs = table_references(closed, n)[2] if closed else None
    out: list[Finding] = []
    if tables:  # the records' own invariant (a pool bug, not a caller's fault, if broken)
        tokens = np.fromiter((t.num_tokens for t in tables), dtype=np.int64, count=len(tables))
        nblocks = np.fromiter((t.num_blocks for t in tables), dtype=np.int64, count=len(tables))
        over = np.flatnonzero(tokens > nblocks * pool.block_size)
        if len(over):
            raise InternalError(f"pool bug: {tables[int(over[0])]!r} has more tokens than its blocks hold")

    def finding(fid: str, mask_or_ids: np.ndarray, message: str, **evidence: Any) -> None:
        ids = np.flatnonzero(mask_or_ids) if mask_or_ids.dtype == bool else mask_or_ids
        show = [int(b) for b in ids[:_SHOW]]
        out.append(Finding(id=fid, severity=Severity.ERROR, message=message, evidence={
            "operation": "audit", "op_seq": pool.op_seq, "block_count": len(ids), "blocks": show,
            "block": show[0] if show else None, "requests": _holders(tables, show[:1]), **evidence}))

    # 3. ref counts against the tables that hold them
    neg = ref < 0
    if neg.any():
        finding("KVG201", neg, f"{int(neg.sum())} block(s) have a ref count below zero: freed more often "
                "than referenced")
    expected = live_refs + closed_refs if closed else live_refs
    drift = (ref != expected) & ~neg
    if drift.any():
        b = int(np.flatnonzero(drift)[0])
        finding("KVG203", drift, f"{int(drift.sum())} block(s) have a ref count that differs from the references "
                f"in live block tables (block {b}: count {int(ref[b])}, tables {int(expected[b])})")
    # 4. lost frees
    if closed_refs is not None:
        leaked = closed_refs > 0
        names = [t.request_id for t in closed[:_SHOW]]
        finding("KVG204", leaked, f"{len(closed)} finished request(s) still reference {int(leaked.sum())} block(s): "
                f"their frees were lost (first: {names[0]!r})", closed_requests=names)
    # 1-2. conservation
    queued = bp.queue.live_ids()
    qcount = np.bincount(queued, minlength=n)
    in_queue = qcount > 0
    referenced = ref > 0
    n_free = int((in_queue & ~bp.cached).sum())
    n_cached = int((in_queue & bp.cached).sum())
    n_ref = int(referenced.sum())
    dup = qcount > 1
    both = in_queue & referenced
    lost = ~in_queue & ~referenced  # unreferenced (or over-freed) and not in the free queue: nobody can use it
    counts = {"free": n_free, "cached_unreferenced": n_cached, "referenced": n_ref, "total": n,
              "queued_twice": int(dup.sum()), "free_and_referenced": int(both.sum()), "lost": int(lost.sum()),
              "below_zero": int(neg.sum())}
    if n_free + n_cached + n_ref != n or dup.any() or both.any() or lost.any() or len(queued) != bp.queue.count:
        bad = dup | both | lost
        finding("KVG206", bad if bad.any() else np.empty(0, dtype=np.int64),
                f"free {n_free} + cached {n_cached} + referenced {n_ref} = {n_free + n_cached + n_ref} blocks, "
                f"pool total {n}; {counts['queued_twice']} queued twice, {counts['free_and_referenced']} both free "
                f"and referenced, {counts['lost']} lost ({counts['below_zero']} with a count below zero)",
                counts=counts)
    # 5. namespaces: every table listing a block is of the namespace its content was written in. Two tables
    # of different namespaces listing one block cannot both match it, so this one comparison covers both.
    if len(live_blocks):
        mixed = live_blocks[pool.ns_of[live_blocks] != live_ns]
        if len(mixed):
            ids = np.unique(mixed)
            finding("KVG205", ids, f"{len(ids)} block(s) are in the block table of a namespace other than the one "
                    f"their contents were written in (tenants without a shared namespace); block {int(ids[0])} "
                    "first", requests_sharing=_holders(tables, [int(ids[0])], limit=8))
    # 6. prefix index vs cached flags
    n_index = len(bp.by_hash)
    if n_index != int(bp.cached.sum()) or (
        n_index and not bp.cached[np.fromiter(bp.by_hash.values(), dtype=np.int64, count=n_index)].all()
    ):
        finding("KVG206", np.empty(0, dtype=np.int64), f"prefix index holds {n_index} hashes but "
                f"{int(bp.cached.sum())} blocks are flagged cached", counts={"index": n_index})
    return out


def _holders(tables: list[BlockTable], blocks: list[int], limit: int = 4) -> list[str]:
    if not blocks:
        return []
    out = []
    for t in tables:
        if np.isin(blocks, t.block_ids).any():
            out.append(t.request_id)
            if len(out) == limit:
                break
    return out
