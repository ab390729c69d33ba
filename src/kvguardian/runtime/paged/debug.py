"""Incremental checks of the paged pool (``PagedKVPool(debug=True)``): each fault is caught at the operation
that causes it, as a KVG2xx finding naming the request, the block(s) and the operation.

Double frees (KVG201), use-after-free writes (KVG202), ref-count drift (KVG203), lost frees (KVG204),
cross-tenant shares (KVG205), lost or doubled blocks (KVG206) and residue reads (KVG211). The checker keeps its
own table references and free-queue record, independent of the allocator's, and only observes: a buggy
scheduler behaves the same with and without it. The fault table: docs/design/paged.md.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

import numpy as np

from kvguardian.core.errors import EXIT_FINDINGS, InternalError, KVGuardianError
from kvguardian.core.findings import Finding, Severity
from kvguardian.runtime.paged.records import BlockTable

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    import torch

    from kvguardian.runtime.paged.view import PoolView

__all__ = ["DebugChecker", "PoolFault"]

_WHO_LIMIT = 65_536
_MAX_BLOCKS_IN_EVIDENCE = 16


class PoolFault(KVGuardianError, RuntimeError):
    """Raised at a faulty pool operation when the pool was built with ``on_fault="raise"``."""

    exit_code = EXIT_FINDINGS

    def __init__(self, finding: Finding) -> None:
        super().__init__(f"{finding.id} {finding.name}: {finding.message}")
        self.finding = finding


class DebugChecker:
    """Observes a `PagedKVPool`'s operations (a `PoolObserver`, and its free queue's `QueueObserver`); only
    the pool and its queue call it."""

    def __init__(self, pool: PoolView, *, capacity: int = 1024, raise_on_fault: bool = False) -> None:
        n = pool.num_blocks
        self.pool = pool
        self.raise_on_fault = raise_on_fault
        self.table_refs = np.zeros(n, dtype=np.int32)  # references from open tables, block by block
        self.leaked_refs = np.zeros(n, dtype=np.int32)  # references from tables closed while holding blocks
        self.released_at = np.zeros(n, dtype=np.int64)  # op number of each block's last release (0: never)
        self.released_by = np.full(n, -1, dtype=np.int64)  # table code of that release's request
        self.slot_owner = np.full(n * pool.block_size, -1, dtype=np.int64)  # table code producing each slot
        self.queued = pool.blocks.queue.contains(range(n))  # blocks in the free queue, as the queue reports
        self.findings: deque[Finding] = deque(maxlen=capacity)
        self.first: dict[str, Finding] = {}  # "*" -> the first finding; id -> the first of that id
        self._who: OrderedDict[int, tuple[str, str]] = OrderedDict()  # table code -> (request, tenant), bounded
        self._op = ""  # the operation being checked
        self._table: BlockTable | None = None  # the table it acts for
        self._layer: int | None = None
        self._reported: set[int] = set()  # blocks already reported by this operation
        self._last_write: tuple[str, tuple[int, ...], int] | None = None  # (request, blocks, op) last flagged
        self._last_residue: tuple[str, tuple[int, ...]] | None = None  # (request, blocks) of the last KVG211

    # ------------------------------------------------------------------ operation boundaries
    def begin(self, op: str, table: BlockTable | None, layer: int | None) -> None:
        self._op, self._table, self._layer = op, table, layer
        self._reported.clear()
        if table is not None:  # write-once fields of the record: still what open() set
            who = self._who.get(table.code)
            if who is not None and who != (table.request_id, table.tenant):
                raise InternalError(f"pool bug: {table!r} changed its owner since open ({who!r})")

    def on_table_add(self, table: BlockTable, ids: np.ndarray) -> None:
        """``table`` now lists ``ids`` (one more reference each)."""
        self.table_refs[ids] += 1

    def on_table_remove(self, table: BlockTable, ids: np.ndarray) -> None:
        """``table`` no longer lists ``ids``."""
        self.table_refs[ids] -= 1

    def on_queued(self, ids: Sequence[int]) -> None:
        self.queued[list(ids)] = True

    def on_dequeued(self, ids: Sequence[int]) -> None:
        self.queued[list(ids)] = False

    def on_open(self, table: BlockTable) -> None:
        self._who[table.code] = (table.request_id, table.tenant)
        if len(self._who) > _WHO_LIMIT:
            self._who.popitem(last=False)

    def end(self, touched: np.ndarray) -> None:
        """After an operation: the table keeps its own invariants, every touched block's ref count equals its
        references, and a touched block is in the free queue exactly when nothing references it."""
        if self._table is not None:
            self._table.check(self.pool.block_size)
        if len(touched) == 0:
            return
        blocks = np.unique(touched)
        if self._reported:
            blocks = blocks[~np.isin(blocks, np.fromiter(self._reported, dtype=np.int64))]
        bp = self.pool.blocks
        ref = bp.ref_counts(blocks)
        expected = self.table_refs[blocks] + self.leaked_refs[blocks]
        neg = ref < 0
        if neg.any():
            self._report("KVG201", blocks[neg], "left a ref count below zero: more frees than references")
        drift = (ref != expected) & ~neg
        if drift.any():
            b = int(blocks[drift][0])
            self._report(
                "KVG203", blocks[drift],
                f"left block {b} with ref count {bp.ref_count(b)} while live tables hold "
                f"{int(expected[drift][0])} reference(s)",
                holders=self._holders(b),
            )
        queued = self.queued[blocks]
        lost = (ref == 0) & ~queued & ~drift
        if lost.any():
            self._report("KVG206", blocks[lost], "left an unreferenced block outside the free queue (lost)")
        both = (ref > 0) & queued
        if both.any():
            self._report("KVG206", blocks[both], "left a block both free (queued) and referenced")

    # ------------------------------------------------------------------ per-operation preconditions
    def pre_release(self, t: BlockTable, ids: np.ndarray, *, held: bool = False) -> None:
        """Before dropping ``t``'s references to ``ids`` (``held``: taken from ``t``'s own table)."""
        bp = self.pool.blocks
        if held:
            gone = ids[bp.ref_counts(ids) <= 0]
            if len(gone):
                b = int(gone[0])
                self._report("KVG201", gone, f"freed block {b} whose references were already dropped"
                             f"{self._released_note(b)}: the request used it after that free")
        else:
            not_held = ids[~np.isin(ids, t.block_ids)]
            counts = bp.ref_counts(not_held)
            free = not_held[counts <= 0]
            if len(free):
                b = int(free[0])
                self._report("KVG201", free, f"released block {b} which is already free{self._released_note(b)}")
            taken = not_held[counts > 0]
            if len(taken):
                b = int(taken[0])
                holders = self._holders(b)
                self._report("KVG201", taken,
                             f"released block {b} which its table does not hold; "
                             f"{', '.join(repr(h) for h in holders) or 'another reference'} still uses it",
                             holders=holders)
        self.released_at[ids] = self.pool.op_seq
        self.released_by[ids] = t.code

    def pre_share(self, t: BlockTable, ids: np.ndarray, *, parent: BlockTable | None = None) -> None:
        """Before ``t`` takes references to existing blocks (prefix hit, raw share, fork)."""
        ns = self.pool.ns_of[ids]
        bad = ids[(ns >= 0) & (ns != t.ns_code)]
        if parent is not None and parent.ns_code != t.ns_code:
            bad = ids
        if len(bad):
            b = int(bad[0])
            holders = self._holders(b)
            owner_ns = self._ns_name(int(self.pool.ns_of[b]))
            self._report("KVG205", bad,
                         f"took block {b} of namespace {owner_ns!r} into namespace {t.namespace!r}"
                         + (f" (held by {', '.join(repr(h) for h in holders)})" if holders else ""),
                         holders=holders, block_namespace=owner_ns, table_namespace=t.namespace)

    def pre_close(self, t: BlockTable) -> None:
        """Before a table is closed: it must hold nothing."""
        if t.num_blocks == 0:
            return
        ids = t.block_ids.copy()
        self._report("KVG204", ids,
                     f"finished with {len(ids)} block(s) still referenced (block {int(ids[0])} first): "
                     "its free was lost")
        self.table_refs[ids] -= 1
        self.leaked_refs[ids] += 1

    def assign_slots(self, t: BlockTable, slots: np.ndarray) -> None:
        """``t`` produces the K/V of ``slots`` (append, raw allocation, copy-on-write)."""
        self.slot_owner[slots] = t.code

    def check_write(self, t: BlockTable | None, request_id: str, slots: torch.Tensor | np.ndarray, layer: int) -> None:
        """The writer must own every slot it writes: the block is in its table, its ref count covers every
        table that lists it, and either no other table lists it or the writer produces that slot (a block
        filled this step while a later request already hit it in the prefix cache)."""
        bs = self.pool.block_size
        s = (slots.numpy() if hasattr(slots, "numpy") else np.asarray(slots)).astype(np.int64)
        if len(s) == 0:
            return
        sb = s // bs
        bp = self.pool.blocks
        if t is None:
            bad = np.unique(sb)
            b = int(bad[0])
            why = f"wrote block {b} but has no open block table (freed or never opened){self._released_note(b)}"
        else:
            held = np.isin(sb, t.block_ids)
            ref, tr, lk = bp.ref_counts(sb), self.table_refs[sb], self.leaked_refs[sb]
            consistent = ref == tr + lk
            exclusive = (tr == 1) & (lk == 0) & (ref == 1)
            ok = held & consistent & (exclusive | (self.slot_owner[s] == t.code))
            if ok.all():
                return
            bad = np.unique(sb[~ok])
            b = int(bad[0])
            holders = [h for h in self._holders(b) if h != request_id]
            others = ", ".join(repr(h) for h in holders)
            if b not in t.block_ids:
                why = (f"wrote block {b}, which its table does not hold"
                       + (f"; {others} holds it" if others else "; it is free") + self._released_note(b))
            elif bp.ref_count(b) != self.table_refs[b] + self.leaked_refs[b]:
                listed = self._holders(b)
                why = (f"wrote block {b}, whose ref count ({bp.ref_count(b)}) does not cover the tables that list it "
                       f"({', '.join(repr(h) for h in listed)}): a reference was dropped while in use"
                       + self._released_note(b))
            else:
                why = f"wrote block {b}, shared with {others or 'another reference'}: copy-on-write was skipped"
        key = (request_id, tuple(bad.tolist()), self.pool.op_seq)
        last = self._last_write
        if last is not None and last[0] == key[0] and last[1] == key[1] and last[2] == key[2] - 1:
            self._last_write = key  # the same bad write, next layer: reported once
            return
        self._last_write = key
        self._report("KVG202", bad, why, request_override=request_id)

    def residue_read(self, request_id: str, slots: np.ndarray, evidence: dict[str, Any]) -> None:
        """A read of ``slots`` that their blocks' current owners did not write since allocation (KVG211);
        the same read repeated layer after layer is reported once."""
        bs = self.pool.block_size
        blocks = np.unique(slots // bs)
        key = (request_id, tuple(blocks[:_MAX_BLOCKS_IN_EVIDENCE].tolist()))
        if self._last_residue == key:
            return
        self._last_residue = key
        s = int(slots[0])
        prev = evidence.get("previous_tenant")
        self._report("KVG211", blocks,
                     f"read slot {s} (block {s // bs}, offset {s % bs}) that its block's owner never wrote since "
                     f"the block was allocated" + (f"; the block last belonged to tenant {prev!r}" if prev else ""),
                     request_override=request_id, **evidence)

    # ------------------------------------------------------------------ reporting
    def take(self) -> list[Finding]:
        out = list(self.findings)
        self.findings.clear()
        return out

    def _report(self, fid: str, blocks: np.ndarray, what: str, *, request_override: str | None = None,
                **evidence: Any) -> None:
        t = self._table
        rid = request_override if request_override is not None else (t.request_id if t else None)
        tenant = t.tenant if t is not None else None
        op = self._op + (f", layer {self._layer}" if self._layer is not None else "")
        ids = [int(b) for b in blocks[:_MAX_BLOCKS_IN_EVIDENCE]]
        more = f" (+{len(blocks) - 1} more)" if len(blocks) > 1 else ""
        message = f"request {rid!r} (tenant {tenant!r}) {what}{more} at op #{self.pool.op_seq} ({op})"
        finding = Finding(
            id=fid, severity=Severity.ERROR, message=message,
            evidence={"request_id": rid, "tenant": tenant, "operation": self._op, "op_seq": self.pool.op_seq,
                      "layer": self._layer, "block": ids[0] if ids else None, "blocks": ids,
                      "block_count": len(blocks), **evidence},
        )
        self.findings.append(finding)
        self.first.setdefault("*", finding)
        self.first.setdefault(fid, finding)
        self.pool.faults_count[fid] += 1
        self._reported.update(ids)
        self._reported.update(int(b) for b in blocks[_MAX_BLOCKS_IN_EVIDENCE:])
        if self.raise_on_fault:
            raise PoolFault(finding)

    def _holders(self, block: int, limit: int = 4) -> list[str]:
        """Requests whose open tables list ``block`` (scans the tables: only when reporting)."""
        out = []
        for t in self.pool.tables():
            if block in t.block_ids:
                out.append(t.request_id)
                if len(out) == limit:
                    break
        return out

    def _released_note(self, block: int) -> str:
        at = int(self.released_at[block])
        if at == 0:
            return ""
        who = self._who.get(int(self.released_by[block]))
        return f" (released at op #{at} by {who[0]!r})" if who else f" (released at op #{at})"

    def _ns_name(self, code: int) -> str:
        return self.pool.namespace_name(code)
