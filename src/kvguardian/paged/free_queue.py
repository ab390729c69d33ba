"""The free list of the block pool: an LRU queue of block ids with vectorised batch operations.

Blocks are popped from the front (least recently freed first) and pushed at the back (cached blocks, kept
for a later prefix hit as long as possible) or at the front (uncached blocks, reused first), as in vLLM's
free-block queue. A cached block that gets a prefix hit leaves the queue from the middle.

The queue is a ring of block ids indexed by absolute positions (``head <= position < tail``; ``head`` may go
negative when blocks are pushed at the front). ``pos_of[block]`` is the position of the block's live entry,
or `NOT_QUEUED`. Removing from the middle only marks the entry dead (``pos_of`` no longer points at it), so
every operation is a handful of numpy calls whatever the batch size; dead entries are skipped when popping
and dropped by `_compact` when the ring fills.
"""

from __future__ import annotations

import numpy as np

from kvguardian._errors import InternalError, UsageError

__all__ = ["NOT_QUEUED", "FreeQueue"]

#: ``pos_of`` value of a block that is not in the queue.
NOT_QUEUED = np.iinfo(np.int64).min


class FreeQueue:
    """LRU queue of ``num_blocks`` block ids, initially ``0, 1, ..., num_blocks - 1`` in that order.

    Only the block pool mutates a queue. Callers guarantee that a pushed block is not queued and that a
    removed block is; `BlockPool` states both where its ref counts change.

    Live entries sit in the middle of a ring twice their number, so pushes at either end and pops usually
    touch one contiguous slice whose positions equal their ring indices (the fast paths below); the general
    path wraps positions modulo the ring size.
    """

    __slots__ = ("_cap", "_idx", "_ring", "count", "head", "pos_of", "tail")

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise UsageError(f"a free queue needs at least 1 block, got {num_blocks}")
        self._cap = 2 * num_blocks  # room for as many dead entries as live ones before compacting
        self._ring = np.empty(self._cap, dtype=np.int32)  # block ids at position % cap
        self._idx = np.arange(self._cap, dtype=np.int64)  # ring indices, sliced instead of np.arange per call
        self.pos_of = np.full(num_blocks, NOT_QUEUED, dtype=np.int64)  # block -> position of its live entry
        self.head = self.tail = num_blocks // 2  # [head, tail): oldest entry .. one past the newest
        self.count = 0  # live entries
        self.push_back(np.arange(num_blocks, dtype=np.int32))

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"<FreeQueue {self.count} live, {self.tail - self.head - self.count} dead>"

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``ids`` are in the queue."""
        return self.pos_of.take(ids) != NOT_QUEUED

    # ------------------------------------------------------------------ mutations
    def push_back(self, ids: np.ndarray) -> None:
        """Append ``ids`` (in order) at the back: they are popped after everything already queued."""
        n = len(ids)
        if n == 0:
            return
        self._make_room(n)
        self._place(self.tail, ids)
        self.tail += n

    def push_front(self, ids: np.ndarray) -> None:
        """Insert ``ids`` at the front, ``ids[0]`` first: they are popped before everything already queued."""
        n = len(ids)
        if n == 0:
            return
        self._make_room(n)
        self._place(self.head - n, ids)
        self.head -= n

    def remove(self, ids: np.ndarray) -> None:
        """Take ``ids`` out of the queue wherever they are (a prefix hit on a cached, unreferenced block)."""
        if len(ids) == 0:
            return
        self.pos_of.put(ids, NOT_QUEUED)
        self.count -= len(ids)

    def pop_front(self, n: int) -> np.ndarray:
        """Remove and return the ``n`` oldest live block ids, oldest first.

        Raises:
            InternalError: fewer than ``n`` live entries (the pool checks availability before popping).
        """
        if n > self.count:
            raise InternalError(f"free queue bug: pop of {n} blocks with {self.count} live; the pool must check first")
        if n == 0:
            return np.empty(0, dtype=np.int32)
        h = self.head
        if h >= 0 and h + n <= self._cap and self.tail - h == self.count:
            # fast path: no dead entry anywhere, one slice of the ring
            out = self._ring[h:h + n].copy()
            self.head = h + n
            self.pos_of.put(out, NOT_QUEUED)
            self.count -= n
            return out
        parts = []
        got = 0
        while got < n:
            want = min(self.tail - self.head, (n - got) + 64)
            pos = np.arange(self.head, self.head + want, dtype=np.int64)
            ids = self._ring[pos % self._cap]
            live = self.pos_of[ids] == pos
            if live.all():
                take = ids[: n - got]
                consumed = len(take)
            else:
                live_ix = np.flatnonzero(live)[: n - got]
                take = ids[live_ix]
                # consume up to the last taken entry, or the whole window if it had too few live ones
                consumed = int(live_ix[-1]) + 1 if len(take) == n - got else want
            parts.append(take)
            got += len(take)
            self.head += consumed
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self.pos_of[out] = NOT_QUEUED
        self.count -= n
        return out

    # ------------------------------------------------------------------ reading (audits)
    def live_ids(self) -> np.ndarray:
        """Every live block id, front first (a duplicate would show twice: the audit looks for that)."""
        if self.head >= 0 and self.tail <= self._cap:  # no wrap: a slice, no modulo
            ids = self._ring[self.head:self.tail]
            return ids[self.pos_of[ids] == self._idx[self.head:self.tail]]
        pos = np.arange(self.head, self.tail, dtype=np.int64)
        ids = self._ring[pos % self._cap]
        return ids[self.pos_of[ids] == pos]

    # ------------------------------------------------------------------ internals
    def _place(self, start: int, ids: np.ndarray) -> None:
        n = len(ids)
        if start >= 0 and start + n <= self._cap:
            self._ring[start:start + n] = ids
            self.pos_of.put(ids, self._idx[start:start + n])
        else:
            pos = np.arange(start, start + n, dtype=np.int64)
            self._ring[pos % self._cap] = ids
            self.pos_of[ids] = pos
        self.count += n

    def _make_room(self, n: int) -> None:
        if self.tail - self.head + n > self._cap:
            self._compact()
            if self.tail - self.head + n > self._cap:
                raise InternalError(
                    f"free queue bug: {self.count} live + {n} pushed exceeds capacity {self._cap // 2}; "
                    "a block was pushed while already queued (double free not caught by the pool)"
                )

    def _compact(self) -> None:
        """Drop dead entries; the live ones move to the middle of the ring, in order."""
        live = self.live_ids()
        k = len(live)
        if k != self.count:
            raise InternalError(f"free queue bug: {k} live entries found, count says {self.count}")
        start = (self._cap - k) // 2
        self._ring[start:start + k] = live
        self.pos_of[live] = self._idx[start:start + k]
        self.head, self.tail = start, start + k
