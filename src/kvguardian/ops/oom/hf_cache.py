"""A bounded prefix cache for Hugging Face caches that gives memory back under pressure.

`BoundedPrefixCache` is an LRU bounded by entries and storage bytes, registered with
``guard.retain(self, reason=..., evict=self.evict)``: declared retention (judged bounded) and the first cache
the pre-OOM guard evicts. `fork` hands out private copies; `put` is an allocation path and asks the guard to
sample first. Keys are never logged. Example: docs/design/oom.md.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from kvguardian.core.errors import UsageError

if TYPE_CHECKING:
    from transformers import Cache

    from kvguardian.ops.oom.guard import OOMGuard
    from kvguardian.runtime.guard import Guard

__all__ = ["BoundedPrefixCache", "cache_nbytes"]


def cache_nbytes(cache: Any) -> int:
    """Storage bytes of the tensors ``cache`` reaches (each storage once)."""
    from kvguardian.core.tensors.storage import reachable_tensors, storage_key, storage_nbytes

    seen: dict[int, int] = {}
    for t in reachable_tensors(cache):
        seen.setdefault(storage_key(t), storage_nbytes(t))
    return sum(seen.values())


class BoundedPrefixCache:
    def __init__(self, *, max_entries: int = 64, max_bytes: int | None = None, guard: Guard | None = None,
                 oom: OOMGuard | None = None, reason: str = "HF prefix cache (bounded LRU)") -> None:
        if max_entries < 1 or (max_bytes is not None and max_bytes < 1):
            raise UsageError(f"max_entries={max_entries}, max_bytes={max_bytes}: both must be positive; fix: e.g. "
                             "BoundedPrefixCache(max_entries=32, max_bytes=2 << 30)")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = self.misses = self.evicted = 0
        self._oom = oom
        if guard is not None:
            guard.retain(self, reason=reason, evict=self.evict)
        elif oom is not None:
            oom.retain(self, reason=reason, evict=self.evict)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> Any:
        """The stored cache (do not write to it: `fork` gives a copy to generate from), or None."""
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return item[0]

    def fork(self, key: Hashable) -> Any:
        """A deep copy of the stored cache, or None."""
        cache = self.get(key)
        return None if cache is None else copy.deepcopy(cache)

    def put(self, key: Hashable, cache: Cache) -> None:
        """Store a copy of ``cache`` under ``key``, evicting least recently used entries past the bounds."""
        if self._oom is not None:
            self._oom.on_allocate()
        stored = copy.deepcopy(cache)
        size = cache_nbytes(stored)
        if self.max_bytes is not None and size > self.max_bytes:
            return  # larger than the whole cache: not kept
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            self._entries[key] = (stored, size)
            self.nbytes += size
            while len(self._entries) > self.max_entries or (
                    self.max_bytes is not None and self.nbytes > self.max_bytes):
                self._pop_oldest()

    def evict(self, need: int) -> int:
        """Drop least recently used entries until ``need`` bytes are freed (or none is left)."""
        freed = 0
        with self._lock:
            while self._entries and freed < need:
                freed += self._pop_oldest()
        return freed

    def clear(self) -> int:
        return self.evict(self.nbytes + 1)

    def _pop_oldest(self) -> int:
        _, (_, size) = self._entries.popitem(last=False)
        self.nbytes -= size
        self.evicted += 1
        return size
