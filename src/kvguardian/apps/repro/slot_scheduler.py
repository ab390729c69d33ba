"""The article's §2.2 scheduler: block tables kept per batch slot, not bound to the request.

It drives a `PagedKVPool` through its raw operations, as a scheduler with its own tables does, and carries two
bugs of the family vLLM and SGLang have shipped (over-free, preemption double free, cross-request corruption):
``stale-free`` (frees by slot number after condensing the batch) and ``share-no-cow`` (writes into a shared,
partially matching block). The pool's debug checks name the first bad operation. Details: docs/design/repro.md.
"""

from __future__ import annotations

import numpy as np

from kvguardian.core.errors import UsageError
from kvguardian.runtime.paged.engine import Sequence
from kvguardian.runtime.paged.pool import PagedKVPool

__all__ = ["BUGS", "SlotScheduler"]

BUGS = ("stale-free", "share-no-cow")


class SlotScheduler:
    """Tables per batch slot: ``slot_rids[i]`` runs in slot ``i`` with blocks ``slot_tables[i]``."""

    def __init__(self, pool: PagedKVPool, bugs: tuple[str, ...] = BUGS) -> None:
        unknown = set(bugs) - set(BUGS)
        if unknown:
            raise UsageError(f"unknown bug(s) {sorted(unknown)}; choose from {list(BUGS)}")
        self.pool = pool
        self.bugs = frozenset(bugs)
        self.slot_rids: list[str] = []
        self.slot_tables: list[list[int]] = []
        self.slot_tokens: list[list[int]] = []  # tokens whose K/V each slot's blocks hold, for prefix sharing

    def _slot(self, seq: Sequence) -> int:
        return self.slot_rids.index(seq.rid)

    def admit(self, seq: Sequence) -> np.ndarray | None:
        pool, bs = self.pool, self.pool.block_size
        tokens = seq.all_tokens()
        shared: list[int] = []
        lcp = 0
        if "share-no-cow" in self.bugs:
            lcp, donor = self._longest_prefix(tokens)
            lcp = min(lcp, len(tokens) - 1)
            if lcp:
                shared = self.slot_tables[donor][: -(-lcp // bs)]
        need = -(-len(tokens) // bs) - len(shared)
        if not pool.can_allocate(need):
            return None
        if not pool.has_table(seq.rid):
            pool.open(seq.rid, seq.req.tenant, shared=seq.req.shared)
        if shared:
            pool.share_blocks(seq.rid, shared)
        table = shared + pool.allocate_blocks(seq.rid, need).tolist()
        self.slot_rids.append(seq.rid)
        self.slot_tables.append(table)
        self.slot_tokens.append(list(tokens))
        seq.num_computed = lcp
        seq.block_ids = np.asarray(table, dtype=np.int32)
        return self._slots(table, lcp, len(tokens))

    def allocate(self, seq: Sequence) -> np.ndarray | None:
        i = self._slot(seq)
        table = self.slot_tables[i]
        tokens = seq.all_tokens()
        need = -(-len(tokens) // self.pool.block_size) - len(table)
        if need > 0:
            if not self.pool.can_allocate(need):
                return None
            table.extend(self.pool.allocate_blocks(seq.rid, need).tolist())
        self.slot_tokens[i] = list(tokens)
        seq.block_ids = np.asarray(table, dtype=np.int32)
        return self._slots(table, seq.num_computed, len(tokens))

    def preempt(self, seq: Sequence) -> None:
        i = self._slot(seq)
        self.pool.release_blocks(seq.rid, self.slot_tables[i][::-1])
        del self.slot_rids[i], self.slot_tables[i], self.slot_tokens[i]
        seq.block_ids = np.empty(0, dtype=np.int32)

    def finish(self, seqs: list[Sequence]) -> None:
        holes = [self._slot(s) for s in seqs]
        if "stale-free" not in self.bugs:  # correct order: free by slot, then condense
            for seq, slot in zip(seqs, holes):
                self.pool.release_blocks(seq.rid, self.slot_tables[slot][::-1])
            self._condense(holes)
        else:  # the bug: condense first, then free "the finished slots", which may hold moved requests now
            self._condense(holes)
            for seq, slot in zip(seqs, holes):
                if slot < len(self.slot_tables):
                    self.pool.release_blocks(seq.rid, self.slot_tables[slot][::-1])
        for seq in seqs:
            self.pool.close(seq.rid)

    # ------------------------------------------------------------------ helpers
    def _condense(self, holes: list[int]) -> None:
        """Fill each hole (ascending) with the last live slot, then drop the tail: the batch stays dense."""
        dead = set(holes)
        for hole in sorted(holes):
            while self.slot_rids and len(self.slot_rids) - 1 in dead:  # dead slots at the tail just go
                dead.discard(len(self.slot_rids) - 1)
                self._pop_last()
            if hole < len(self.slot_rids):  # the last slot is live now: move it into the hole
                self.slot_rids[hole] = self.slot_rids[-1]
                self.slot_tables[hole] = self.slot_tables[-1]
                self.slot_tokens[hole] = self.slot_tokens[-1]
                self._pop_last()
                dead.discard(hole)

    def _pop_last(self) -> None:
        self.slot_rids.pop()
        self.slot_tables.pop()
        self.slot_tokens.pop()

    def _longest_prefix(self, tokens: list[int]) -> tuple[int, int]:
        best, donor = 0, -1
        probe = np.asarray(tokens)
        for i, other in enumerate(self.slot_tokens):
            m = min(len(other), len(probe))
            if m == 0:
                continue
            diff = np.flatnonzero(np.asarray(other[:m]) != probe[:m])
            n = int(diff[0]) if len(diff) else m
            if n > best:
                best, donor = n, i
        return best, donor

    def _slots(self, table: list[int], start: int, end: int) -> np.ndarray:
        bs = self.pool.block_size
        pos = np.arange(start, end, dtype=np.int64)
        return np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs
