"""The block allocator: per-block ref counts, the LRU free queue and the prefix-cache index.

It knows blocks, not requests (`PagedKVPool` binds them to tables). A block is free, cached (unreferenced but
in the prefix index, evicted last) or referenced; allocation pops the queue's front and evicts any prefix hash
it pops. Ids are Python ints and ref counts a Python list, since the common operations touch one block or a
few dozen, where numpy's per-call dispatch costs more than a Python loop; whole-pool readers get numpy
snapshots. Measurements (bench/pool.py): docs/design/paged.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter

import numpy as np

from kvguardian.core.errors import InternalError, UsageError
from kvguardian.runtime.paged.free_queue import FreeQueue
from kvguardian.runtime.paged.prefix import EventStream

__all__ = ["BlockIds", "BlockPool", "PoolExhausted"]

#: What the pool's batch operations accept: a list of ints (what they return) or a numpy array of ids.
BlockIds = Sequence[int] | np.ndarray


_GATHER_MIN = 48  # ids from which one numpy gather of the id objects beats a Python loop over them
_UNIFORM_MIN = 128  # ids from which reading the counts with one itemgetter first pays for building it


class PoolExhausted(UsageError):
    """Not enough free or evictable blocks; the scheduler should wait, or preempt a request first."""


def as_id_list(ids: BlockIds | Iterable[int]) -> list[int]:
    """Block ids as a list of Python ints (lists pass through unchanged)."""
    if type(ids) is list:
        return ids
    if isinstance(ids, np.ndarray):
        return ids.tolist()  # type: ignore[no-any-return]
    return [int(b) for b in ids]


class BlockPool:
    """``num_blocks`` blocks with ref counts, an LRU free queue and a hash -> block prefix index.

    Only `BlockPool` methods change ref counts, cached flags, the queue and the index; `PagedKVPool` calls
    them. Batch methods take ``ids`` as a list of ints or a numpy array, unique within the call.
    """

    def __init__(self, num_blocks: int, *, events: EventStream | None = None) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise UsageError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks  # references from block tables
        self._cached = bytearray(num_blocks)  # 1: registered in the prefix index
        self._cached_view = np.frombuffer(self._cached, dtype=bool)
        self._cached_view.flags.writeable = False
        self.hash_of: list[bytes | None] = [None] * num_blocks  # block -> its prefix hash
        self.by_hash: dict[bytes, int] = {}  # prefix hash -> block (one block per hash)
        self.queue = FreeQueue(num_blocks)
        # one int object per block id, allocated in id order: ids coming back as numpy arrays (PagedKVPool's
        # tables) are queued as these objects, not as the fresh ints ``tolist()`` makes. Fresh ints end up
        # scattered over the heap as a server runs, and every later use of a queued id reads its object: an aged
        # pool allocates and frees measurably slower with fresh ints than with these (docs/design/paged.md;
        # the rest of the gap is the order ids come out in, see bench/pool.py's aged_vs_fresh).
        self._ids = self.queue.front[::-1]
        self._id_objects = np.array(self._ids, dtype=object)
        # no stream given: events off, as vLLM's BlockPool defaults to (PagedKVPool passes its own stream)
        self.events = events if events is not None else EventStream(enabled=False)
        self.evictions = 0  # cached blocks whose hash was dropped to reuse or clear them
        self.allocated = 0  # blocks handed out by get_new_blocks
        self.freed = 0  # references dropped by free_blocks

    def __repr__(self) -> str:
        return f"<BlockPool {self.num_blocks} blocks, {self.queue.count} free/cached>"

    # ------------------------------------------------------------------ reading
    @property
    def num_available(self) -> int:
        """Blocks an allocation can take now: free plus cached-unreferenced (evictable)."""
        return self.queue.count

    @property
    def ref(self) -> np.ndarray:
        """A snapshot of every block's ref count (int64; writing to it changes nothing)."""
        return np.array(self._ref, dtype=np.int64)

    @property
    def cached(self) -> np.ndarray:
        """Read-only view of the per-block "registered in the prefix index" flags."""
        return self._cached_view

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def _queued_ids(self, ids: BlockIds) -> list[int]:
        """``ids`` as a list, numpy arrays mapped to the pool's own id objects (see ``_ids``)."""
        if isinstance(ids, np.ndarray):
            if len(ids) >= _GATHER_MIN:
                return self._id_objects[ids].tolist()  # type: ignore[no-any-return]
            canon = self._ids
            return [canon[b] for b in ids.tolist()]
        return as_id_list(ids)

    def ref_counts(self, ids: BlockIds | Iterable[int]) -> np.ndarray:
        """The ref counts of ``ids`` (int64), in order."""
        ref = self._ref
        return np.array([ref[b] for b in as_id_list(ids)], dtype=np.int64)

    # ------------------------------------------------------------------ allocate / free / touch
    def get_new_blocks(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the front of the free queue, evict their hashes, set their ref counts to 1.

        Raises:
            PoolExhausted: fewer than ``n`` blocks are free or evictable.
        """
        ids = self.queue.take(n)
        if ids is None:
            raise PoolExhausted(
                f"block pool has {self.queue.count} free or evictable blocks, {n} requested; "
                "fix: check can_allocate() first and preempt or wait"
            )
        ref, hash_of = self._ref, self.hash_of
        if n == 1 and not ref[ids[0]]:  # decode's one block, inlined (evicting its hash if it was cached)
            b = ids[0]
            ref[b] = 1
            self.allocated += 1
            if self._cached[b]:  # the flag, not hash_of: 1 byte a block keeps more of the pool in cache
                h: bytes = hash_of[b]  # type: ignore[assignment]  # a cached block has its hash
                del self.by_hash[h]
                hash_of[b] = None
                self._cached[b] = 0
                self.evictions += 1
                if self.events.enabled:
                    self.events.emit("removed", (h,), ids)
            return ids
        if self.events.enabled:
            return self._claim_reporting(ids)
        by_hash, cached = self.by_hash, self._cached
        evicted = 0
        for b in ids:  # counts set and hashes evicted in one pass (no event to build)
            if ref[b]:
                # invariant: a queued block is unreferenced (free_blocks queues a block only when its count
                # reaches 0, touch dequeues it before counting a reference)
                raise InternalError(f"block pool bug: allocated block {b} had {ref[b]} reference(s)")
            ref[b] = 1
            if cached[b]:
                del by_hash[hash_of[b]]  # type: ignore[arg-type]  # a cached block has its hash
                hash_of[b] = None
                cached[b] = 0
                evicted += 1
        self.evictions += evicted
        self.allocated += n
        return ids

    def _claim_reporting(self, ids: list[int]) -> list[int]:
        """`get_new_blocks`' loop when events are on: the evicted hashes are collected for a "removed" event."""
        ref, hash_of = self._ref, self.hash_of
        evict = False
        for b in ids:
            if ref[b]:
                raise InternalError(f"block pool bug: allocated block {b} had {ref[b]} reference(s)")
            ref[b] = 1
            if hash_of[b] is not None:
                evict = True
        if evict:
            self._drop_hashes(ids)
        self.allocated += len(ids)
        return ids

    def free_blocks(self, ids: BlockIds) -> list[int]:
        """Drop one reference to each of ``ids`` (unique). Blocks reaching 0 go back to the queue: uncached
        ones at the front (``ids[0]`` first), cached ones at the back (``ids[0]`` evicted first). Callers
        pass a table's blocks in reverse, so a request's tail blocks are reused before its prefix.

        Returns the ids that reached 0. A block whose count goes below 0 (a double free) leaves the queue
        and is never handed out again: the audit reports it, and the queue keeps its invariant (a queued
        block has count 0).
        """
        if type(ids) is not list:
            ids = self._queued_ids(ids)
        ref, hash_of, q = self._ref, self.hash_of, self.queue
        if len(ids) == 1:  # the last reference to one block (decode's preemption, CoW), inlined
            b = ids[0]
            if ref[b] == 1:
                ref[b] = 0
                self.freed += 1
                if hash_of[b] is not None:
                    q.push_back(ids)
                elif q.observer is None:
                    q.front.append(b)  # push_front of one block
                else:
                    q.push_front(ids)
                return ids
        if len(ids) >= _UNIFORM_MIN and self._free_uniform(ids):
            return ids
        # one pass: drop the counts and flag the cached blocks that reach 0 as the back's (what push_back
        # would do in a second pass; a flag is the same whichever pass writes it)
        at = q.at_back
        odd = cached = plain = False
        for b in ids:
            r = ref[b] - 1
            ref[b] = r
            if r:
                odd = True
            elif hash_of[b] is not None:
                at[b] = True
                cached = True
            else:
                plain = True
        self.freed += len(ids)
        if odd or (cached and plain):
            return self._requeue(ids)
        if cached:
            q.push_back_flagged(ids)
        else:
            q.push_front(ids)
        return ids

    def _free_uniform(self, ids: list[int]) -> bool:
        """`free_blocks`' common large case: every count is 1 and the blocks are all cached (a finished
        request's full blocks: the back) or all uncached (the front). The counts and flags are read in C
        (one ``itemgetter`` over the ids), leaving the Python loop only the writes. False, with nothing
        changed, for any other batch."""
        n = len(ids)
        get = itemgetter(*ids)
        if get(self._ref).count(1) != n:
            return False
        n_cached = get(self._cached).count(1)
        ref, q = self._ref, self.queue
        if n_cached == n:
            at = q.at_back
            for b in ids:
                ref[b] = 0
                at[b] = True
            q.push_back_flagged(ids)
        elif n_cached == 0:
            for b in ids:
                ref[b] = 0
            q.push_front(ids)
        else:
            return False
        self.freed += n
        return True

    def _requeue(self, ids: list[int]) -> list[int]:
        """The general case of `free_blocks`, after the counts were dropped (and the cached blocks that
        reached 0 flagged): cached and uncached blocks are mixed (a request's table: its partial last block
        is uncached), some are still referenced, or a count went below zero."""
        ref, hash_of, q = self._ref, self.hash_of, self.queue
        front: list[int] = []
        back: list[int] = []
        over: list[int] = []
        for b in ids:
            r = ref[b]
            if r == 0:
                (front if hash_of[b] is None else back).append(b)
            elif r == -1:  # it was queued (count 0) and is now over-freed: never hand it out again
                over.append(b)
        if front:
            q.push_front(front)
        if back:
            q.push_back_flagged(back)
        for b in over:
            q.discard(b)
        return front + back

    def touch(self, ids: BlockIds) -> None:
        """Take one more reference to each of ``ids`` (unique): a prefix hit or a share. Unreferenced
        blocks leave the free queue first, so they cannot be allocated to someone else."""
        if type(ids) is not list:
            ids = as_id_list(ids)
        ref = self._ref
        if len(ids) == 1:
            b = ids[0]
            r = ref[b]
            if not r:
                self.queue.discard(b)
            ref[b] = r + 1
            return
        idle = []
        for b in ids:
            r = ref[b]
            if not r:
                idle.append(b)
            ref[b] = r + 1
        if idle:
            self.queue.discard_many(idle)

    # ------------------------------------------------------------------ prefix index
    def lookup(self, h: bytes) -> int | None:
        return self.by_hash.get(h)

    def cache_block(self, block: int, h: bytes) -> bool:
        """Register ``block`` under hash ``h``. False when another block already holds ``h`` (two requests
        computed the same prefix; the second copy stays uncached) or the block is already cached."""
        if h in self.by_hash or self._cached[block]:
            return False
        self.by_hash[h] = block
        self.hash_of[block] = h
        self._cached[block] = 1
        return True

    def evict_cached(self, max_blocks: int | None = None) -> int:
        """Drop the hashes of up to ``max_blocks`` unreferenced cached blocks, least recently freed first.
        They stay in the free queue as free blocks. Returns how many were evicted."""
        cached = self._cached
        victims = [b for b in self.queue.back_ids() if cached[b]]
        victims += [b for b in reversed(self.queue.front) if cached[b]]  # cached while queued: rare
        if max_blocks is not None:
            victims = victims[:max_blocks]
        if victims:
            self._drop_hashes(victims)
        return len(victims)

    def reset_prefix_cache(self) -> int:
        """Drop every hash (referenced blocks stay in use, uncached). Returns how many were dropped."""
        n = len(self.by_hash)
        if n:
            for b in self.by_hash.values():
                self.hash_of[b] = None
                self._cached[b] = 0
            self.by_hash.clear()
            self.evictions += n
            # every queued block is now alike (no hash to keep in LRU order): queue them in id order, so the
            # allocations that follow walk the pool's lists in order, as on a new pool, rather than in the
            # scattered order hours of LRU churn left (slower per block: bench/pool.py aged_vs_fresh)
            q = self.queue
            q.reorder(self._id_objects[np.sort(q.live_ids())].tolist())
        self.events.emit("cleared", (), ())
        return n

    def _drop_hashes(self, ids: list[int]) -> None:
        """Evict the prefix hashes of the cached blocks among ``ids`` (uncached ones are skipped)."""
        if len(ids) == 1:
            b = ids[0]
            h = self.hash_of[b]
            if h is not None:
                del self.by_hash[h]
                self.hash_of[b] = None
                self._cached[b] = 0
                self.evictions += 1
                if self.events.enabled:
                    self.events.emit("removed", (h,), ids)
            return
        hashes = []
        dropped = []
        hash_of, by_hash, cached = self.hash_of, self.by_hash, self._cached
        for b in ids:
            h = hash_of[b]
            if h is not None:
                del by_hash[h]
                hash_of[b] = None
                cached[b] = 0
                hashes.append(h)
                dropped.append(b)
        self.evictions += len(dropped)
        if self.events.enabled:
            self.events.emit("removed", hashes, dropped)
