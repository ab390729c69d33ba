"""The block allocator: per-block ref counts, the LRU free queue and the prefix-cache index.

It knows blocks, not requests: `PagedKVPool` binds blocks to (request, tenant) tables on top of it. Every
batch operation is a few numpy calls, so its cost per block falls with the batch size (bench/pool.py).

A block is in exactly one of three states, and the pool keeps them apart:

- **free**: ref count 0, no prefix hash, in the free queue (front: reused first);
- **cached**: ref count 0, registered in the prefix index, in the free queue (back: evicted last, LRU);
- **referenced**: ref count > 0 (by one or more block tables), not in the free queue; may also be cached.

Allocation pops the queue's front and evicts the prefix hash of any cached block it pops.
"""

from __future__ import annotations

import numpy as np

from kvguardian._errors import InternalError, UsageError
from kvguardian.paged.free_queue import FreeQueue
from kvguardian.paged.prefix import EventStream

__all__ = ["BlockPool", "PoolExhausted"]


class PoolExhausted(UsageError):
    """Not enough free or evictable blocks; the scheduler should wait, or preempt a request first."""


class BlockPool:
    """``num_blocks`` blocks with ref counts, an LRU free queue and a hash -> block prefix index.

    Only `BlockPool` methods mutate ``ref``, ``cached``, the queue and the index; `PagedKVPool` calls them.
    """

    def __init__(self, num_blocks: int, *, events: EventStream | None = None) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise UsageError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.ref = np.zeros(num_blocks, dtype=np.int32)  # references from block tables
        self.cached = np.zeros(num_blocks, dtype=bool)  # registered in the prefix index
        self.hash_of: list[bytes | None] = [None] * num_blocks  # block -> its prefix hash
        self.by_hash: dict[bytes, int] = {}  # prefix hash -> block (one block per hash)
        self.queue = FreeQueue(num_blocks)
        self.events = events if events is not None else EventStream()
        self.evictions = 0  # cached blocks whose hash was dropped to reuse or clear them
        self.allocated = 0  # blocks handed out by get_new_blocks
        self.freed = 0  # references dropped by free_blocks

    def __repr__(self) -> str:
        return f"<BlockPool {self.num_blocks} blocks, {self.queue.count} free/cached>"

    # ------------------------------------------------------------------ counts
    @property
    def num_available(self) -> int:
        """Blocks an allocation can take now: free plus cached-unreferenced (evictable)."""
        return self.queue.count

    # ------------------------------------------------------------------ allocate / free / touch
    def get_new_blocks(self, n: int) -> np.ndarray:
        """Pop ``n`` blocks from the front of the free queue, evict their hashes, set their ref counts to 1.

        Raises:
            PoolExhausted: fewer than ``n`` blocks are free or evictable.
        """
        if n > self.queue.count:
            raise PoolExhausted(
                f"block pool has {self.queue.count} free or evictable blocks, {n} requested; "
                "fix: check can_allocate() first and preempt or wait"
            )
        ids = self.queue.pop_front(n)
        if n == 0:
            return ids
        # (take/put/count_nonzero: the cheapest numpy calls, the per-call cost dominates small batches)
        evict = self.cached.take(ids)
        if np.count_nonzero(evict):
            self._drop_hashes(ids[evict])
        # invariant: a queued block is unreferenced (free_blocks queues a block only when its count hits 0,
        # touch dequeues it before counting a reference)
        if np.count_nonzero(self.ref.take(ids)):
            raise InternalError(f"block pool bug: allocated blocks {ids[self.ref[ids] != 0][:8].tolist()} had refs")
        self.ref.put(ids, 1)
        self.allocated += n
        return ids

    def free_blocks(self, ids: np.ndarray) -> np.ndarray:
        """Drop one reference to each of ``ids`` (unique). Blocks reaching 0 go back to the queue: uncached
        ones at the front (``ids[0]`` first), cached ones at the back (``ids[0]`` evicted first). Callers
        pass a table's blocks in reverse, so a request's tail blocks are reused before its prefix.

        Returns the ids that reached 0. A block whose count goes below 0 (a double free) leaves the queue
        and is never handed out again: the audit reports it, and the queue keeps its invariant (a queued
        block has count 0).
        """
        if len(ids) == 0:
            return ids
        after = self.ref.take(ids) - 1
        self.ref.put(ids, after)
        self.freed += len(ids)
        low = after <= 0
        if not np.count_nonzero(low):  # every block is still referenced by someone else
            return ids[:0]
        zero = ids[low]
        below = after[low] < 0
        if np.count_nonzero(below):
            # over-freed: take it out of the queue so it is never handed out again; the audit reports it
            neg = zero[below]
            queued = self.queue.contains(neg)
            if np.count_nonzero(queued):
                self.queue.remove(neg[queued])
            zero = zero[~below]
        cached = self.cached.take(zero)
        if np.count_nonzero(cached):
            self.queue.push_front(zero[~cached])
            self.queue.push_back(zero[cached])
        else:
            self.queue.push_front(zero)
        return zero

    def touch(self, ids: np.ndarray) -> None:
        """Take one more reference to each of ``ids`` (unique): a prefix hit or a share. Unreferenced
        blocks leave the free queue first, so they cannot be allocated to someone else."""
        if len(ids) == 0:
            return
        queued = self.queue.contains(ids)
        if np.count_nonzero(queued):
            self.queue.remove(ids[queued])
        self.ref.put(ids, self.ref.take(ids) + 1)

    # ------------------------------------------------------------------ prefix index
    def lookup(self, h: bytes) -> int | None:
        return self.by_hash.get(h)

    def cache_block(self, block: int, h: bytes) -> bool:
        """Register ``block`` under hash ``h``. False when another block already holds ``h`` (two requests
        computed the same prefix; the second copy stays uncached) or the block is already cached."""
        if h in self.by_hash or self.cached[block]:
            return False
        self.by_hash[h] = block
        self.hash_of[block] = h
        self.cached[block] = True
        return True

    def evict_cached(self, max_blocks: int | None = None) -> int:
        """Drop the hashes of up to ``max_blocks`` unreferenced cached blocks, least recently freed first.
        They stay in the free queue as free blocks. Returns how many were evicted."""
        live = self.queue.live_ids()
        victims = live[self.cached[live]]
        if max_blocks is not None:
            victims = victims[:max_blocks]
        if len(victims):
            self._drop_hashes(victims)
        return len(victims)

    def reset_prefix_cache(self) -> int:
        """Drop every hash (referenced blocks stay in use, uncached). Returns how many were dropped."""
        n = len(self.by_hash)
        if n:
            ids = np.fromiter(self.by_hash.values(), dtype=np.int32, count=n)
            for b in ids.tolist():
                self.hash_of[b] = None
            self.cached[ids] = False
            self.by_hash.clear()
            self.evictions += n
        self.events.emit("cleared", (), ())
        return n

    def _drop_hashes(self, ids: np.ndarray) -> None:
        hashes = []
        for b in ids.tolist():
            h = self.hash_of[b]
            if h is None:
                raise InternalError(f"block pool bug: block {b} is marked cached but has no hash")
            del self.by_hash[h]
            self.hash_of[b] = None
            hashes.append(h)
        self.cached[ids] = False
        self.evictions += len(ids)
        self.events.emit("removed", hashes, ids.tolist())
