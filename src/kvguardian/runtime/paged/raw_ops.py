"""The pool's raw operations: block ids come from the caller, as from a scheduler that keeps its own tables.

They trust the caller the way vLLM's ``BlockPool.free_blocks`` does: ``release_blocks`` drops a count whether
or not the request's table holds the block. The debug checks (`kvguardian.runtime.paged.debug`) say when that was
wrong, at the operation. `PagedKVPool` inherits them; they use only its internals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvguardian.core.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from kvguardian.runtime.paged.block_pool import BlockPool
    from kvguardian.runtime.paged.records import BlockTable
    from kvguardian.runtime.paged.view import PoolObserver

__all__ = ["RawBlockOps"]


class RawBlockOps:
    """allocate_blocks / share_blocks / release_blocks on a request's table."""

    # provided by PagedKVPool
    blocks: BlockPool
    block_size: int
    num_blocks: int
    ns_of: np.ndarray
    filled: np.ndarray
    _debug: PoolObserver | None
    _slot: np.ndarray
    on_allocate: Callable[[int], None] | None  # the allocation observer (see PagedKVPool)

    def table(self, request_id: str) -> BlockTable:  # pragma: no cover - PagedKVPool's
        raise NotImplementedError

    def _begin(self, op: str, table: BlockTable | None, *, layer: int | None = None) -> None:  # pragma: no cover
        raise NotImplementedError

    def _end(self, touched: np.ndarray) -> None:  # pragma: no cover
        raise NotImplementedError

    def _claim(self, t: BlockTable, ids: np.ndarray, copy_of: int | None = None) -> None:  # pragma: no cover
        raise NotImplementedError

    def _table_add(self, t: BlockTable, ids: np.ndarray) -> None:  # pragma: no cover
        raise NotImplementedError

    def _table_remove(self, t: BlockTable, ids: np.ndarray) -> None:  # pragma: no cover
        raise NotImplementedError

    def allocate_blocks(self, request_id: str, n: int) -> np.ndarray:
        """Allocate ``n`` blocks to the request's table (raw path: counted as full, never prefix-cached)."""
        t = self.table(request_id)
        self._begin("allocate_blocks", t)
        ids = np.array(self.blocks.get_new_blocks(n), dtype=np.int32)
        self._claim(t, ids)
        self.ns_of[ids] = t.ns_code
        self.filled[ids] = self.block_size
        self._table_add(t, ids)
        if self._debug is not None:
            bs = self.block_size
            self._debug.assign_slots(t, (ids.astype(np.int64)[:, None] * bs + np.arange(bs)).ravel())
        self._end(ids)
        if self.on_allocate is not None:
            self.on_allocate(n)
        return ids.copy()

    def share_blocks(self, request_id: str, block_ids: Sequence[int] | np.ndarray) -> None:
        """Add references to existing blocks to the request's table (raw path: the caller vouches that
        their contents are this request's prefix)."""
        t = self.table(request_id)
        ids = self._unique_in_order(block_ids)
        self._begin("share_blocks", t)
        if self._debug is not None:
            self._debug.pre_share(t, ids)
        self.blocks.touch(ids)
        self._table_add(t, ids)
        self._end(ids)

    def release_blocks(self, request_id: str, block_ids: Sequence[int] | np.ndarray) -> None:
        """Drop one reference to each block on behalf of the request (raw path: like vLLM's ``free_blocks``,
        the count is dropped whether or not the request's table holds the block)."""
        t = self.table(request_id)
        ids = self._unique_in_order(block_ids)
        self._begin("release_blocks", t)
        if self._debug is not None:
            self._debug.pre_release(t, ids)
        self._table_remove(t, ids)
        self.blocks.free_blocks(ids)
        self._end(ids)

    def _unique_in_order(self, block_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Caller's block ids as int32, first occurrences only, validated against the pool's range.

        Raises:
            UsageError: an id outside the pool.
        """
        ids = np.asarray(block_ids, dtype=np.int32).ravel()
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_blocks):
            raise UsageError(f"block ids must be in 0..{self.num_blocks - 1}; got {ids.min()}..{ids.max()}")
        if len(ids) > 1:
            order = np.arange(len(ids), dtype=np.int64)
            self._slot.put(ids[::-1], order[::-1])  # the last write wins: each id keeps its first index
            first = self._slot.take(ids) == order
            if not first.all():
                ids = ids[first]
        return ids
