"""Retained caches that can be evicted under memory pressure: ``guard.retain(obj, reason=..., evict=callable)``.

The callback is called with the number of bytes the guard would like freed and returns the bytes it freed
(or None when it cannot tell). It must be safe to call from the guard's sampling thread. The registry holds
``obj`` weakly where it can, and a bound method of ``obj`` as a `weakref.WeakMethod`, so registering a cache
never keeps it alive (the auditor must not become the leak); when ``obj`` dies its entry goes with it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from kvguardian.core.errors import UsageError

__all__ = ["EvictCallback", "EvictorRegistry", "registry_of"]

EvictCallback = Callable[[int], "int | None"]


class _Entry:
    __slots__ = ("_fn", "_obj", "reason")

    def __init__(self, obj: object, reason: str, evict: EvictCallback) -> None:
        self.reason = reason
        try:
            self._obj: Callable[[], Any] | None = weakref.ref(obj)
        except TypeError:  # plain dicts and lists: the entry lives as long as the registry
            self._obj = None
        owner = getattr(evict, "__self__", None)
        if owner is not None and owner is obj and self._obj is not None:
            self._fn: Callable[[], Any] = weakref.WeakMethod(evict)  # type: ignore[arg-type]
        else:
            self._fn = lambda: evict

    def callback(self) -> EvictCallback | None:
        if self._obj is not None and self._obj() is None:
            return None
        fn: EvictCallback | None = self._fn()
        return fn


class EvictorRegistry:
    """Registered eviction callbacks, oldest first."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items())

    def add(self, obj: object, reason: str, evict: EvictCallback) -> None:
        if not callable(evict):
            raise UsageError(f"evict={evict!r} is not callable; fix: pass a function taking the bytes to free, "
                             "e.g. evict=cache.evict")
        if not reason:
            raise UsageError("an evictable retention needs a reason, e.g. reason='session KV store'")
        with self._lock:
            self._entries.append(_Entry(obj, reason, evict))

    def items(self) -> list[tuple[str, EvictCallback]]:
        """(reason, callback) of every live registration, dropping dead ones."""
        out = []
        with self._lock:
            live = []
            for e in self._entries:
                fn = e.callback()
                if fn is not None:
                    live.append(e)
                    out.append((e.reason, fn))
            self._entries = live
        return out


_REGISTRIES: weakref.WeakKeyDictionary[Any, EvictorRegistry] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def registry_of(guard: object) -> EvictorRegistry:
    """The registry of ``guard`` (a `kvguardian.Guard`), created on first use; it dies with the guard."""
    with _LOCK:
        reg = _REGISTRIES.get(guard)
        if reg is None:
            reg = _REGISTRIES[guard] = EvictorRegistry()
        return reg
