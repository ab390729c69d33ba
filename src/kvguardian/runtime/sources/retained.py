"""Declared retention: objects the program says keep KV on purpose (``guard.retain(prefix_cache, reason=...)``).

The KV reachable from a declared object is marked retained in the ledger (`Ledger.retain_keys`). Objects that
support weak references are re-examined at every check (`DeclaredRetention.refresh`), so KV added to them later
is covered too and KV they let go of is not retained any more; plain dicts and lists are examined once.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from kvguardian.core.errors import UsageError
from kvguardian.core.ledger import Ledger

__all__ = ["DeclaredRetention"]


class DeclaredRetention:
    """The declared objects (weakly held) and the entry keys each one retained when last examined."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._lock = threading.RLock()
        self._declared: list[tuple[Any, str]] = []  # (weakref to the declared object, reason)
        self._keys: dict[int, set[Any]] = {}  # id(weakref of a declared object) -> keys it retained

    def retain(self, obj: object, *, reason: str) -> int:
        """Declare the KV reachable from ``obj`` retained; returns the number of KV entries marked now.

        Raises:
            UsageError: ``reason`` is empty.
        """
        if not reason:
            raise UsageError("guard.retain(obj, reason=...) needs a reason, e.g. reason='system prompt cache'")
        try:
            ref: Any = weakref.ref(obj)
        except TypeError:
            ref = None
        if ref is not None:
            with self._lock:
                self._declared.append((ref, reason))
        return self._apply(obj, reason, ref)

    def refresh(self) -> None:
        """Re-examine every declared object still alive; forget the dead ones (before a check)."""
        with self._lock:
            live = []
            obj = None
            for ref, reason in self._declared:
                obj = ref()
                if obj is not None:
                    self._apply(obj, reason, ref)
                    live.append((ref, reason))
                else:
                    self._keys.pop(id(ref), None)
            self._declared = live
            del obj

    def _apply(self, obj: object, reason: str, ref: weakref.ref[Any] | None) -> int:
        """Mark what ``obj`` holds now; what it held before and no longer holds is not retained any more."""
        from kvguardian.core.tensors.storage import reachable_tensors

        keys = {t.untyped_storage().data_ptr() for t in reachable_tensors(obj)}
        if ref is not None:
            before = self._keys.get(id(ref), set())
            stale = before - keys
            if stale:
                self._ledger.clear_retention(stale)
            self._keys[id(ref)] = keys
        return self._ledger.retain_keys(keys, reason)
