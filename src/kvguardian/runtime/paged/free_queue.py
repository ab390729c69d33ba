"""The free list of the block pool: an LRU queue of block ids (vLLM's free-block queue) in two parts.

Blocks pop from the front; uncached blocks are pushed at the front, cached ones at the back. Since nothing
pushed at the front lands behind the back part, the queue is a stack (``front``) plus an append-only back list
whose entries are flagged dead when a block leaves from the middle (a prefix hit), so no position is recorded.
Garbage is dropped in amortised O(1). Everything is Python lists, cheaper than numpy for small batches. The
layout and its costs: docs/design/paged.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from kvguardian.core.errors import InternalError, UsageError

__all__ = ["FreeQueue", "QueueObserver"]

_COMPACT_MIN = 1024  # entries of garbage (popped prefix or dead entries) before dropping them is worth it


class QueueObserver(Protocol):
    """Told of every block the queue takes in or gives out (the pool's debug checker keeps its own record)."""

    def on_queued(self, ids: Sequence[int]) -> None: ...

    def on_dequeued(self, ids: Sequence[int]) -> None: ...


class FreeQueue:
    """LRU queue of ``num_blocks`` block ids, initially ``0, 1, ..., num_blocks - 1`` in that order.

    Only the block pool mutates a queue. Callers guarantee that a pushed block is not queued; `BlockPool`
    states it where its ref counts change.
    """

    __slots__ = ("_back", "_dead", "_head", "_stale", "at_back", "front", "observer")

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise UsageError(f"a free queue needs at least 1 block, got {num_blocks}")
        self.front: list[int] = list(range(num_blocks - 1, -1, -1))  # a stack: front[-1] is popped first
        self._back: list[int] = []  # entries from _head on, oldest first; some dead (see _stale)
        self.at_back: list[bool] = [False] * num_blocks  # the block's live entry is in the back part
        self._stale: list[int] = [0] * num_blocks  # dead entries of the block at or after _head
        self._head = 0
        self._dead = 0  # dead entries at or after _head (the sum of _stale)
        self.observer: QueueObserver | None = None

    @property
    def count(self) -> int:
        """Blocks in the queue."""
        return len(self.front) + len(self._back) - self._head - self._dead

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"<FreeQueue {len(self.front)} at the front, {self.back_count} at the back>"

    @property
    def back_count(self) -> int:
        return len(self._back) - self._head - self._dead

    def in_back(self, block: int) -> bool:
        return self.at_back[block]

    def __contains__(self, block: int) -> bool:
        return self.at_back[block] or block in self.front

    # ------------------------------------------------------------------ mutations
    def push_back(self, ids: Sequence[int]) -> None:
        """Append ``ids`` (in order) at the back: they are popped after everything already queued."""
        at = self.at_back
        for b in ids:
            at[b] = True
        self._back.extend(ids)
        if self.observer is not None:
            self.observer.on_queued(ids)

    def push_back_flagged(self, ids: Sequence[int]) -> None:
        """`push_back` for a caller that already set ``at_back[b] = True`` for every b in ``ids`` (the pool
        does it in its free loop, saving a second pass)."""
        self._back.extend(ids)
        if self.observer is not None:
            self.observer.on_queued(ids)

    def push_front(self, ids: Sequence[int]) -> None:
        """Insert ``ids`` at the front, ``ids[0]`` first: they are popped before everything already queued."""
        if len(ids) == 1:
            self.front.append(ids[0])
        else:
            self.front.extend(reversed(ids))
        if self.observer is not None:
            self.observer.on_queued(ids)

    def discard(self, block: int) -> bool:
        """Take ``block`` out of the queue wherever it is; False if it was not queued."""
        at = self.at_back
        if at[block]:  # a prefix hit's path: its entry goes dead in place
            at[block] = False
            self._stale[block] += 1
            dead = self._dead = self._dead + 1
            if dead >= _COMPACT_MIN and 2 * dead >= len(self._back) - self._head:
                self._rebuild()
        else:
            try:
                self.front.remove(block)  # rare: a free, uncached block leaving from the middle
            except ValueError:
                return False
        if self.observer is not None:
            self.observer.on_dequeued((block,))
        return True

    def discard_many(self, blocks: Sequence[int]) -> int:
        """`discard` of each of ``blocks`` (unique) in one pass: a prefix hit's idle blocks leave the back
        part with no call per block. Returns how many were queued."""
        if self.observer is not None:  # debug: told block by block
            return sum(self.discard(b) for b in blocks)
        at, stale = self.at_back, self._stale
        gone = 0
        stray: list[int] = []
        for b in blocks:
            if at[b]:
                at[b] = False
                stale[b] += 1
                gone += 1
            else:
                stray.append(b)
        if gone:
            dead = self._dead = self._dead + gone
            if dead >= _COMPACT_MIN and 2 * dead >= len(self._back) - self._head:
                self._rebuild()
        for b in stray:  # rare: free, uncached blocks leaving the front part from the middle
            try:
                self.front.remove(b)
            except ValueError:
                continue
            gone += 1
        return gone

    def remove(self, ids: Iterable[int]) -> None:
        """Take ``ids`` out of the queue wherever they are (a prefix hit on a cached, unreferenced block).

        Raises:
            InternalError: a block is not queued (the pool must check first).
        """
        for b in ids:
            if not self.discard(b):
                raise InternalError(f"free queue bug: removal of block {b}, which is not queued")

    def reorder(self, order: Sequence[int]) -> None:
        """Queue ``order`` (the blocks already queued, front first) in place of the current order, all in the
        front part. For a pool whose queued blocks are all alike, with no prefix hash to keep in LRU order
        (`BlockPool.reset_prefix_cache`); the observer is not told (no block enters or leaves)."""
        at, stale = self.at_back, self._stale
        for b in self._back[self._head:]:
            at[b] = False
            stale[b] = 0
        self._back = []
        self._head = self._dead = 0
        self.front[:] = order[::-1]

    def take(self, n: int) -> list[int] | None:
        """Remove and return the ``n`` oldest block ids, oldest first; None (and nothing removed) when fewer
        than ``n`` are queued. The allocator's call: the queue's count is computed only when the front part
        alone cannot serve ``n``."""
        front = self.front
        k = len(front)
        if n <= k:
            if n == 1:  # decode's one block: the most frequent call
                out = [front.pop()]
            else:
                out = front[k - n:]
                del front[k - n:]
                out.reverse()
        elif n == 1:  # the same from the back part (every free block cached): _pop_one, inlined when no entry is dead
            back, h = self._back, self._head
            if not self._dead and h < len(back):
                b = back[h]
                self._head = h + 1
                self.at_back[b] = False
                if h >= _COMPACT_MIN and 2 * h >= len(back):
                    self._drop_popped()
            else:
                got = self._pop_one()
                if got is None:
                    return None
                b = got
            out = [b]
        else:
            if n - k > len(self._back) - self._head - self._dead:
                return None
            more = self._pop_back(n - k)
            if k:
                out = front[::-1]
                front.clear()
                out += more
            else:
                out = more
        if self.observer is not None:
            self.observer.on_dequeued(out)
        return out

    def pop_front(self, n: int) -> list[int]:
        """`take`, for callers that checked the count first.

        Raises:
            InternalError: fewer than ``n`` entries (the pool checks availability before popping).
        """
        out = self.take(n)
        if out is None:
            raise InternalError(f"free queue bug: pop of {n} blocks with {self.count} live; the pool must check first")
        return out

    def _pop_one(self) -> int | None:
        """The back part's oldest live block (dead entries skipped), or None if it holds none."""
        back, h, stale = self._back, self._head, self._stale
        end = len(back)
        while h < end:
            b = back[h]
            h += 1
            if self._dead and stale[b]:
                stale[b] -= 1
                self._dead -= 1
                continue
            self.at_back[b] = False
            self._head = h
            if h >= _COMPACT_MIN and 2 * h >= end:
                self._drop_popped()
            return b
        self._head = h
        return None

    def _pop_back(self, n: int) -> list[int]:
        """The back part's ``n`` oldest live blocks (the caller checked that there are that many)."""
        back, h = self._back, self._head
        if self._dead == 0:
            seg = back[h:h + n]
            h += n
        else:  # skip dead entries (each once), a window at a time
            stale = self._stale
            seg = []
            while len(seg) < n:
                window = back[h:h + n - len(seg)]
                h += len(window)
                for b in window:
                    if stale[b]:
                        stale[b] -= 1
                        self._dead -= 1
                    else:
                        seg.append(b)
        at = self.at_back
        for b in seg:
            at[b] = False
        self._head = h
        if h >= _COMPACT_MIN and 2 * h >= len(back):
            self._drop_popped()
        return seg

    def _drop_popped(self) -> None:
        """Drop the popped prefix (one memmove; no entry records a position, so nothing is rewritten)."""
        del self._back[:self._head]
        self._head = 0

    def _rebuild(self) -> None:
        """Drop the popped prefix and the dead entries (a block's dead entries come before its live one)."""
        stale = self._stale
        live = []
        for b in self._back[self._head:]:
            if stale[b]:
                stale[b] -= 1
            else:
                live.append(b)
        self._back = live
        self._head = self._dead = 0

    # ------------------------------------------------------------------ reading (audits)
    def back_ids(self) -> list[int]:
        """The back part (cached blocks, and blocks whose hash was dropped while queued), oldest first."""
        entries = self._back[self._head:]
        if not self._dead:
            return entries
        stale = self._stale
        skip: dict[int, int] = {}  # dead entries still to skip, per block (nothing in the queue is changed)
        out = []
        for b in entries:
            k = skip.get(b)
            if k is None:
                k = stale[b]
            if k:
                skip[b] = k - 1
            else:
                skip[b] = 0
                out.append(b)
        return out

    def live_ids(self) -> np.ndarray:
        """Every queued block id, front first (a duplicate would show twice: the audit looks for that)."""
        back = self.back_ids()
        ids = np.empty(len(self.front) + len(back), dtype=np.int64)
        k = len(self.front)
        ids[:k] = self.front[::-1]
        ids[k:] = back
        return ids

    def contains(self, ids: Iterable[int]) -> np.ndarray:
        """Boolean mask: which of ``ids`` are queued (a set of the front part is built: for checks, not hot
        paths)."""
        front = set(self.front)
        at = self.at_back
        return np.fromiter((at[b] or b in front for b in map(int, ids)), dtype=bool)
