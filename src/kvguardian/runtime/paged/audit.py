"""The full audit of a paged pool, vectorised with numpy: `PagedKVPool.check_invariants()` calls `audit`.

Each invariant is recomputed from an independent record: conservation of free, cached and referenced blocks
(KVG206), ref counts against live tables (KVG203/KVG201), no table closed holding blocks (KVG204), no block in
the tables of two namespaces (KVG205), and the prefix index against the cached flags (KVG206). One finding per
violated invariant. The list: docs/design/paged.md.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from kvguardian.core.errors import InternalError
from kvguardian.core.findings import Finding, Severity

if TYPE_CHECKING:  # pragma: no cover
    from kvguardian.runtime.paged.records import BlockTable
    from kvguardian.runtime.paged.view import PoolView

__all__ = ["audit", "table_references"]

_SHOW = 16
_LIVE = attrgetter("live")
_NS = attrgetter("ns_code")
_TOKENS = attrgetter("num_tokens")


def table_references(tables: list[BlockTable], num_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(every block id listed by ``tables``, the lister's namespace code for each, references per block)."""
    blocks, ns, refs, _ = _references(tables, num_blocks)
    return blocks, ns, refs


def _references(tables: list[BlockTable], num_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if not tables:
        empty = np.empty(0, dtype=np.int32)
        return empty, empty, np.zeros(num_blocks, dtype=np.int64), np.empty(0, dtype=np.int64)
    views = list(map(_LIVE, tables))
    blocks = np.concatenate(views)
    lengths = np.fromiter(map(len, views), dtype=np.int64, count=len(views))
    ns = np.repeat(np.fromiter(map(_NS, tables), dtype=np.int32, count=len(tables)), lengths)
    return blocks, ns, np.bincount(blocks, minlength=num_blocks), lengths


def audit(pool: PoolView) -> list[Finding]:
    """Every invariant of ``pool`` at once; an empty list means the pool is consistent.

    The common case (nothing wrong) costs one pass per invariant; the masks that locate a violation are
    computed only when its count says there is one.
    """
    bp = pool.blocks
    n = pool.num_blocks
    ref = bp.ref
    tables = pool.tables()
    closed = pool.closed_tables()
    live_blocks, live_ns, live_refs, lengths = _references(tables, n)
    closed_refs = table_references(closed, n)[2] if closed else None
    out: list[Finding] = []
    if tables:  # the records' own invariant (a pool bug, not a caller's fault, if broken)
        tokens = np.fromiter(map(_TOKENS, tables), dtype=np.int64, count=len(tables))
        over = np.flatnonzero(tokens > lengths * pool.block_size)
        if len(over):
            raise InternalError(f"pool bug: {tables[int(over[0])]!r} has more tokens than its blocks hold")

    def finding(fid: str, mask_or_ids: np.ndarray, message: str, **evidence: Any) -> None:
        ids = np.flatnonzero(mask_or_ids) if mask_or_ids.dtype == bool else mask_or_ids
        show = [int(b) for b in ids[:_SHOW]]
        out.append(Finding(id=fid, severity=Severity.ERROR, message=message, evidence={
            "operation": "audit", "op_seq": pool.op_seq, "block_count": len(ids), "blocks": show,
            "block": show[0] if show else None, "requests": _holders(tables, show[:1]), **evidence}))

    # 3. ref counts against the tables that hold them
    expected = live_refs + closed_refs if closed_refs is not None else live_refs
    mismatch = ref != expected
    neg = ref < 0
    n_neg = int(np.count_nonzero(neg))
    if n_neg:
        finding("KVG201", neg, f"{n_neg} block(s) have a ref count below zero: freed more often than referenced")
    if np.count_nonzero(mismatch) > n_neg:
        drift = mismatch & ~neg
        b = int(np.flatnonzero(drift)[0])
        finding("KVG203", drift, f"{int(np.count_nonzero(drift))} block(s) have a ref count that differs from the "
                f"references in live block tables (block {b}: count {int(ref[b])}, tables {int(expected[b])})")
    # 4. lost frees
    if closed_refs is not None:
        leaked = closed_refs > 0
        names = [t.request_id for t in closed[:_SHOW]]
        finding("KVG204", leaked, f"{len(closed)} finished request(s) still reference "
                f"{int(np.count_nonzero(leaked))} block(s): their frees were lost (first: {names[0]!r})",
                closed_requests=names)
    # 1-2. conservation: the free queue (free + cached-unreferenced) and the referenced blocks partition the pool
    queued = bp.queue.live_ids()
    referenced = ref > 0
    n_ref = int(np.count_nonzero(referenced))
    n_cached = int(np.count_nonzero(bp.cached.take(queued)))
    n_free = len(queued) - n_cached
    in_queue = np.zeros(n, dtype=bool)
    in_queue[queued] = True
    n_in_queue = int(np.count_nonzero(in_queue))
    n_both = int(np.count_nonzero(in_queue & referenced))
    if n_free + n_cached + n_ref != n or n_in_queue != len(queued) or n_both or len(queued) != bp.queue.count:
        dup = np.bincount(queued, minlength=n) > 1
        both = in_queue & referenced
        lost = ~in_queue & ~referenced  # unreferenced (or over-freed) and not in the free queue: nobody can use it
        counts = {"free": n_free, "cached_unreferenced": n_cached, "referenced": n_ref, "total": n,
                  "queued_twice": int(dup.sum()), "free_and_referenced": n_both, "lost": int(lost.sum()),
                  "below_zero": n_neg}
        bad = dup | both | lost
        finding("KVG206", bad if bad.any() else np.empty(0, dtype=np.int64),
                f"free {n_free} + cached {n_cached} + referenced {n_ref} = {n_free + n_cached + n_ref} blocks, "
                f"pool total {n}; {counts['queued_twice']} queued twice, {n_both} both free and referenced, "
                f"{counts['lost']} lost ({n_neg} with a count below zero)", counts=counts)
    # 5. namespaces: every table listing a block is of the namespace its content was written in. Two tables
    # of different namespaces listing one block cannot both match it, so this one comparison covers both.
    if len(live_blocks):
        wrong = pool.ns_of.take(live_blocks) != live_ns
        if np.count_nonzero(wrong):
            ids = np.unique(live_blocks[wrong])
            finding("KVG205", ids, f"{len(ids)} block(s) are in the block table of a namespace other than the one "
                    f"their contents were written in (tenants without a shared namespace); block {int(ids[0])} "
                    "first", requests_sharing=_holders(tables, [int(ids[0])], limit=8))
    # 6. prefix index vs cached flags
    n_index = len(bp.by_hash)
    n_flagged = int(np.count_nonzero(bp.cached))
    if n_index != n_flagged or (
        n_index and not bp.cached[np.fromiter(bp.by_hash.values(), dtype=np.int64, count=n_index)].all()
    ):
        finding("KVG206", np.empty(0, dtype=np.int64), f"prefix index holds {n_index} hashes but "
                f"{n_flagged} blocks are flagged cached", counts={"index": n_index})
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
