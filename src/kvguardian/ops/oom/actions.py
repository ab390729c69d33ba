"""What the guard does under pressure, in order: evict, then (when configured) preempt; shed as a last resort.

`PoolPrefixEviction` evicts a paged pool's unreferenced prefix blocks (LRU, under the engine's lock);
`RetainedEviction` asks caches registered with ``guard.retain(..., evict=...)``, oldest first; `CallbackAction`
carries preemption and shedding into the engine at its next step. `release_memory` hands freed heap pages back
to the kernel (``malloc_trim``), without which the cgroup counter would not move. Details: docs/design/oom.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvguardian.runtime.sources.evictable import EvictorRegistry

if TYPE_CHECKING:
    from kvguardian.runtime.paged import PagedKVPool

__all__ = ["CallbackAction", "Evicted", "PoolPrefixEviction", "RetainedEviction", "release_memory"]


@dataclass(frozen=True)
class Evicted:
    """The outcome of one eviction step."""

    reason: str  # metric label: "pool_prefix:<pool>", "retained:<reason>", "preempt"
    count: int  # blocks, caches or requests
    nbytes: int | None  # bytes freed, when known
    releases_heap: bool = False  # freed Python/torch heap memory: worth a malloc_trim


class PoolPrefixEviction:
    """Evict cached, unreferenced blocks of ``pool`` (LRU) for the bytes wanted."""

    def __init__(self, pool: PagedKVPool, *, name: str = "main", lock: AbstractContextManager[Any] | None = None,
                 lock_timeout: float = 0.05) -> None:
        self.pool = pool
        self.reason = f"pool_prefix:{name}"
        self.lock = lock
        self.lock_timeout = lock_timeout
        self.busy = 0  # passes skipped because the engine held the pool longer than lock_timeout
        self.name = name

    def relieves(self, signal: str) -> bool:
        """A preallocated pool's cached blocks hold no memory of their own: evicting them relieves the pool's
        occupancy and a KV budget, not the cgroup or the GPU."""
        return signal in (f"pool:{self.name}", "kv_budget")

    def run(self, need: int) -> list[Evicted]:
        bb = int(getattr(self.pool, "block_bytes", 0) or 0)
        blocks = -(-need // bb) if bb else need  # a pool without K/V tensors is measured in blocks
        lock = self.lock
        acquire = getattr(lock, "acquire", None)
        if acquire is not None:
            if not acquire(timeout=self.lock_timeout):
                self.busy += 1
                return []
            try:
                n = self.pool.evict_cached(blocks)
            finally:
                lock.release()  # type: ignore[union-attr]
        else:
            n = self.pool.evict_cached(blocks)
        return [Evicted(self.reason, n, n * bb if bb else None)] if n else []


class RetainedEviction:
    """Ask each registered retained cache to free bytes until ``need`` is covered (or all were asked)."""

    def __init__(self, registry: EvictorRegistry, on_error: Callable[[str, BaseException], None]) -> None:
        self.registry = registry
        self.on_error = on_error

    def relieves(self, signal: str) -> bool:
        return True  # a retained cache may live anywhere (host, GPU, counted by the ledger)

    def run(self, need: int) -> list[Evicted]:
        out = []
        for reason, fn in self.registry.items():
            try:
                freed = fn(need)
            except Exception as exc:  # the user's callback: contained, counted, the next one is asked
                self.on_error(f"evict callback {reason!r}", exc)
                continue
            nbytes = int(freed) if isinstance(freed, (int, float)) and freed >= 0 else None
            if nbytes != 0:
                out.append(Evicted(f"retained:{reason}", 1, nbytes, releases_heap=True))
            if nbytes is not None:
                need -= nbytes
                if need <= 0:
                    break
        return out


class CallbackAction:
    """``fn(n) -> how many`` (preempt or shed), carried out by the engine; ``label`` names it in metrics."""

    def __init__(self, label: str, fn: Callable[[int], int], relieves: Callable[[str], bool] | None = None) -> None:
        self.label = label
        self.fn = fn
        self._relieves = relieves

    def relieves(self, signal: str) -> bool:
        return True if self._relieves is None else self._relieves(signal)

    def run(self, n: int = 1) -> int:
        return int(self.fn(n) or 0)


_trim: Any = None
_trim_lock = threading.Lock()


def _malloc_trim() -> Any:
    global _trim
    with _trim_lock:
        if _trim is None:
            _trim = False
            name = ctypes.util.find_library("c")
            try:
                fn = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
            except OSError:
                fn = None
            if fn is not None:
                fn.argtypes = [ctypes.c_size_t]
                fn.restype = ctypes.c_int
                _trim = fn
        return _trim


def release_memory(*, collect: bool = False) -> bool:
    """Give freed heap memory back to the kernel (glibc ``malloc_trim(0)``); with ``collect`` a full GC pass
    first (for caches freed only through reference cycles). False where there is no malloc_trim (musl, macOS)."""
    if collect:
        gc.collect()
    fn = _malloc_trim()
    if not fn:
        return False
    fn(0)
    return True
