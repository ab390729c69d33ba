"""`Notes`: what sources tell the ledger besides entries, as a facet of `Ledger` (``ledger.notes``): evidence of
grad-tracked KV, instrumentation errors, classes audited through a generic path, and lifecycle events about a
whole cache object. Bounded; snapshots copy them (`Ledger.snapshot`)."""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvguardian.core.callsite import user_site, warn_at_user
from kvguardian.core.errors import UsageError
from kvguardian.core.ledger.events import EVENT_KINDS, EventBuffer
from kvguardian.core.ledger.fields import cache_event
from kvguardian.core.ledger.records import RequestInfo
from kvguardian.core.ledger.table import EntryTable

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from kvguardian.core.ledger.fields import CacheEventFields

__all__ = ["Notes"]

_MAX_CLASSES = 256
_MAX_GRAD = 256


class Notes:
    """The notes of one ledger, under its lock."""

    def __init__(self, lock: threading.RLock, table: EntryTable, events: EventBuffer,
                 clock: Callable[[], float]) -> None:
        self._lock = lock
        self._table = table
        self._events = events
        self._clock = clock
        self._grad: deque[dict[str, Any]] = deque(maxlen=_MAX_GRAD)
        self._errors: Counter[str] = Counter()
        self._unknown: dict[str, str] = {}  # class audited through a generic path -> why
        self._unknown_sites: dict[str, str | None] = {}  # the same classes -> the user's line first met at

    def grad(self, observation: dict[str, Any]) -> None:
        """Keep the evidence of a grad-tracked KV observation (the last 256)."""
        with self._lock:
            self._grad.append(observation)

    def error(self, site: str) -> int:
        """Count an instrumentation error at ``site``; returns the count so far for that site."""
        self._errors[site] += 1
        return self._errors[site]

    def release_errors_to(self, handler: Callable[[str, BaseException], None] | None) -> None:
        """Who is told when applying a storage's release fails (fail-open: the guard counts and logs it)."""
        self._table.on_release_error = handler

    def unknown(self, cls: str, why: str) -> None:
        """A source met a class it does not know (a cache or layer class) and audits it through a generic path,
        because ``why``. The first reason is kept, for at most 256 classes; the user is warned once (KVG107)."""
        with self._lock:
            if cls in self._unknown or len(self._unknown) >= _MAX_CLASSES:
                return
            self._unknown[cls] = why
            self._unknown_sites[cls] = user_site()
        warn_at_user(f"kv-guardian KVG107: cache class {cls} is not one kv-guardian knows; audited through the "
                     f"generic path ({why})")

    def unknown_classes(self) -> dict[str, str]:
        """Class -> why, for every class audited through a generic path."""
        with self._lock:
            return dict(self._unknown)

    def cache_event(self, kind: str, *, cache: str, request: RequestInfo | None,
                    **fields: Unpack[CacheEventFields]) -> None:
        """A lifecycle event about a whole cache object (scope "cache"): init on its first prefill, hit when a
        later request reuses it, evict on crop/reset, release when it is freed. ``fields`` are `Event` fields by
        keyword (``nbytes``, ``layer``, ``detail``, ``shape``, ...) and ``ts`` (default: now)."""
        if kind not in EVENT_KINDS:
            raise UsageError(f"unknown event kind {kind!r}; use one of {', '.join(EVENT_KINDS)}")
        event = cache_event(kind, cache, request, fields, self._clock)
        with self._lock:
            self._events.cache_event(event)

    def copied(self) -> dict[str, Any]:
        """Copies of every note, as `LedgerSnapshot` fields (the caller holds the lock)."""
        return {
            "grad_observations": tuple(
                {**o, "layers": list(o.get("layers", ())), "layer_updates": dict(o.get("layer_updates", {}))}
                for o in self._grad
            ),
            "instrumentation_errors": dict(self._errors),
            "unknown_classes": dict(self._unknown),
            "unknown_sites": dict(self._unknown_sites),
        }

    def errors(self) -> dict[str, int]:
        """Instrumentation errors by site, so far."""
        return dict(self._errors)
