"""The free list of the block pool: an LRU queue of block ids (vLLM's free-block queue) in two parts.

Blocks are popped from the front (least recently freed first) and pushed at the front (uncached blocks,
reused first) or at the back (cached blocks, kept for a later prefix hit as long as possible). A cached
block that gets a prefix hit leaves the queue from the middle.

Nothing pushed at the front ever lands behind something pushed at the back, so the queue is always
``[everything pushed at the front, newest first][the initial blocks, then everything pushed at the back,
oldest first]``, and it is kept as exactly those two parts:

- ``front``: a Python list used as a stack (its end is the queue's front);
- the back: a Python list read from ``head`` on. ``back_pos[block]`` is the *position* of a block's entry:
  its index plus ``base``, the number of entries dropped from the list's start so far. Removing a block from
  the middle writes a tombstone (``-1``) there; pops skip tombstones.

Garbage is dropped in two ways, each amortised O(1) per operation: the popped prefix, once it is half the
list, by one ``del back[:head]`` (a memmove in C) and ``base += head`` -- positions stay valid, nothing is
rewritten; tombstones, once they are half the live part, by rebuilding the list and rewriting its blocks'
positions (also done before positions would outgrow a one-digit Python int, so no operation takes a
slower path as the queue ages).

Block ids are Python ints and every operation is list slicing plus one small Python loop: a batch of one
block costs a few hundred nanoseconds, not numpy's microseconds of per-call dispatch (bench/pool.py).

Removing a block from the front part (a share of a free, uncached block; an over-free of a queued block) is
a linear search in C: both are rare, caller-error paths.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from kvguardian._errors import InternalError, UsageError

__all__ = ["FreeQueue", "QueueObserver"]

_TOMB = -1
_COMPACT_MIN = 1024  # entries of garbage (popped prefix or tombstones) before dropping them is worth it
_REBASE_AT = 1 << 29  # positions are rewritten from 0 before they reach 2**30 (two-digit Python ints)


class QueueObserver(Protocol):
    """Told of every block the queue takes in or gives out (the pool's debug checker keeps its own record)."""

    def on_queued(self, ids: Sequence[int]) -> None: ...

    def on_dequeued(self, ids: Sequence[int]) -> None: ...


class FreeQueue:
    """LRU queue of ``num_blocks`` block ids, initially ``0, 1, ..., num_blocks - 1`` in that order.

    Only the block pool mutates a queue. Callers guarantee that a pushed block is not queued; `BlockPool`
    states it where its ref counts change.
    """

    __slots__ = ("_back", "_base", "_dead", "_head", "back_pos", "front", "observer")

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise UsageError(f"a free queue needs at least 1 block, got {num_blocks}")
        self.front: list[int] = list(range(num_blocks - 1, -1, -1))  # a stack: front[-1] is popped first
        self._back: list[int] = []  # entries from _head on, oldest first; _TOMB where a block left
        # position (index + _base) of a block's entry in _back; valid only while that entry holds the block
        self.back_pos: list[int] = [-1] * num_blocks
        self._base = 0  # entries dropped from _back's start so far (since positions were last rewritten)
        self._head = 0
        self._dead = 0  # tombstones at or after _head
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

    @property
    def back_end(self) -> int:
        """The position the next block pushed at the back gets (see `push_back`'s ``placed``)."""
        return self._base + len(self._back)

    def in_back(self, block: int) -> bool:
        i = self.back_pos[block] - self._base  # may be stale: valid only if that entry, after the head, holds it
        return self._head <= i < len(self._back) and self._back[i] == block

    def __contains__(self, block: int) -> bool:
        return self.in_back(block) or block in self.front

    # ------------------------------------------------------------------ mutations
    def push_back(self, ids: Sequence[int], *, placed: bool = False) -> None:
        """Append ``ids`` (in order) at the back: they are popped after everything already queued.

        ``placed``: the caller already set ``back_pos[ids[k]] = back_end + k`` for every k, with no other
        change to the queue since it read `back_end` (the pool does it in its free loop, saving a second pass).
        """
        back = self._back
        if not placed:
            pos = self.back_pos
            i = self._base + len(back)
            for b in ids:
                pos[b] = i
                i += 1
        back.extend(ids)
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
        back, i = self._back, self.back_pos[block] - self._base
        if self._head <= i < len(back) and back[i] == block:  # in_back(block), inlined: a prefix hit's path
            back[i] = _TOMB
            dead = self._dead = self._dead + 1
            if 2 * (dead + self._head) >= len(back) and dead >= _COMPACT_MIN:
                self._collect()
        else:
            try:
                self.front.remove(block)  # rare: a free, uncached block leaving from the middle
            except ValueError:
                return False
        if self.observer is not None:
            self.observer.on_dequeued((block,))
        return True

    def remove(self, ids: Iterable[int]) -> None:
        """Take ``ids`` out of the queue wherever they are (a prefix hit on a cached, unreferenced block).

        Raises:
            InternalError: a block is not queued (the pool must check first).
        """
        for b in ids:
            if not self.discard(b):
                raise InternalError(f"free queue bug: removal of block {b}, which is not queued")

    def discard_many(self, blocks: Sequence[int]) -> int:
        """`discard` of each of ``blocks`` (unique) in one pass: a prefix hit's idle blocks leave the back
        part with no call per block. Returns how many were queued."""
        if self.observer is not None:  # debug: told block by block
            return sum(self.discard(b) for b in blocks)
        back, pos, base, head = self._back, self.back_pos, self._base, self._head
        end = len(back)
        gone = 0
        stray: list[int] = []
        for b in blocks:
            i = pos[b] - base
            if head <= i < end and back[i] == b:
                back[i] = _TOMB
                gone += 1
            else:
                stray.append(b)
        if gone:
            dead = self._dead = self._dead + gone
            if dead >= _COMPACT_MIN and 2 * (dead + head) >= end:
                self._collect()
        for b in stray:  # rare: free, uncached blocks leaving the front part from the middle
            try:
                self.front.remove(b)
            except ValueError:
                continue
            gone += 1
        return gone

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
        elif n == 1:
            b = self._pop_one()
            if b is None:
                return None
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
        """The back part's oldest block (tombstones skipped), or None if it holds none."""
        back, h = self._back, self._head
        end = len(back)
        while h < end:
            b = back[h]
            h += 1
            if b != _TOMB:
                self._head = h
                if h >= _COMPACT_MIN and 2 * (h + self._dead) >= end:
                    self._collect()
                return b
            self._dead -= 1
        self._head = h
        return None

    def _pop_back(self, n: int) -> list[int]:
        back, h = self._back, self._head
        seg = back[h:h + n]
        if self._dead == 0 or _TOMB not in seg:
            h += n
        else:  # skip tombstones (each is skipped once), a window at a time
            got: list[int] = []
            while len(got) < n:
                window = back[h:h + n - len(got)]
                h += len(window)
                live = [b for b in window if b != _TOMB]
                self._dead -= len(window) - len(live)
                got += live
            seg = got
        self._head = h
        if h >= _COMPACT_MIN and 2 * (h + self._dead) >= len(back):
            self._collect()
        return seg

    def _collect(self) -> None:
        """Called once garbage (popped prefix + tombstones) is half the back list. Mostly popped prefix: drop
        it with one memmove, positions stay valid (``base`` grows by the same amount); mostly tombstones (or
        positions about to outgrow one-digit ints): rebuild the list. Either way the work is at most a few
        entries per pop or removal since the last collection."""
        h = self._head
        if self._dead >= h or self._base + h >= _REBASE_AT:
            self._compact()
            return
        del self._back[:h]
        self._head = 0
        self._base += h

    def _compact(self) -> None:
        """Drop the popped prefix and the tombstones; rewrite the live entries' positions from 0."""
        live = [b for b in self._back[self._head:] if b != _TOMB]
        pos = self.back_pos
        for i, b in enumerate(live):
            pos[b] = i
        self._back = live
        self._head = self._dead = self._base = 0

    # ------------------------------------------------------------------ reading (audits)
    def back_ids(self) -> list[int]:
        """The back part (cached blocks, and blocks whose hash was dropped while queued), oldest first."""
        return [b for b in self._back[self._head:] if b != _TOMB]

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
        return np.fromiter((b in front or self.in_back(b) for b in map(int, ids)), dtype=bool)
