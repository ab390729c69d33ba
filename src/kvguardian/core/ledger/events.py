"""Lifecycle events and the one bounded buffer that keeps them.

An entry's events (scope "entry") are init, append, hit, evict and release; a source also reports events about
a whole cache object (scope "cache"). The buffer keeps the newest ``capacity`` events and counts the ones it
dropped; appends after an entry's first (one per layer per decode step) are only counted (`EventBuffer.appends`):
a buffer of per-step events would cost more than the rest of the hook and evict everything else.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from kvguardian.core.ledger.records import Record

__all__ = ["EVENT_KINDS", "Event", "EventBuffer"]

#: Lifecycle event kinds, in the article's words; "pressure": the pre-OOM guard's actions (`kvguardian.ops.oom`).
EVENT_KINDS = ("init", "append", "hit", "evict", "release", "pressure")


class Event(NamedTuple):
    """One lifecycle event. Never carries KV contents."""

    ts: float  # time.monotonic() when it happened (for release: when the storage was freed)
    kind: str  # one of EVENT_KINDS
    entry_id: int  # 0 for cache-scope events
    request_id: str | None
    tenant: str | None
    layer: int | None
    nbytes: int  # storage bytes of the entry (or the cache) at the time
    detail: str | None = None  # e.g. "superseded", "crop", the hit's previous owner
    # the article's lifecycle fields; None where they do not apply
    scope: str = "entry"  # "entry": one KV storage; "cache": a whole cache object (HF Cache, custom model)
    cache: str | None = None  # cache label ("DynamicCache#3", "EncoderDecoderCache#1.cross"), when known
    shape: tuple[int, ...] | None = None  # init: [B, H_kv, S, D] of the first layer's keys
    dtype: str | None = None  # init
    device: str | None = None  # init
    hit_ratio: float | None = None  # hit: reused tokens / (reused + newly prefilled tokens)
    latency_delta: float | None = None  # hit: first-token latency minus the cold baseline, seconds
    first_token_s: float | None = None  # init/hit (cache scope): the request's first-token latency, seconds

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, without the fields that do not apply (None)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self._asdict().items() if v is not None}


_new_tuple = tuple.__new__


class EventBuffer:
    """The newest ``capacity`` events, the count of each kind, and how many were dropped (the caller locks)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.buffer: deque[Event] = deque(maxlen=capacity)
        self.counts: Counter[str] = Counter()  # by kind; cache-scope kinds as "cache_<kind>"
        self.dropped = 0  # events pushed out of the full buffer
        self.appends = 0  # coalesced appends not yet in counts["append"] (see fold_appends)

    def entry_event(self, ts: float, kind: str, rec: Record, detail: str | None) -> None:
        """Buffer an event about one entry."""
        buffer = self.buffer
        if len(buffer) == self.capacity:
            self.dropped += 1
        shape: tuple[int, ...] | None = None
        dtype: str | None = None
        device: str | None = None
        if kind == "init":
            shape, dtype, device = tuple(rec.shape), rec.dtype, rec.device
        # The one positional construction of an Event: tuple.__new__ is cheaper than Event(**fields)
        # (docs/design/ledger.md), and it runs once per entry created, owner change and release. The order is
        # Event's field order.
        buffer.append(_new_tuple(Event, (
            ts, kind, rec.entry_id, rec.request_id, rec.tenant, rec.layer, rec.storage_bytes, detail,
            "entry", rec.cache, shape, dtype, device, None, None, None,
        )))
        self.counts[kind] += 1

    def cache_event(self, event: Event) -> None:
        """Buffer an event about a whole cache object (scope "cache")."""
        if len(self.buffer) == self.capacity:
            self.dropped += 1
        self.buffer.append(event)
        self.counts[f"cache_{event.kind}"] += 1

    def fold_appends(self) -> None:
        """Add the coalesced appends to the counts (before a read)."""
        if self.appends:
            self.counts["append"] += self.appends
            self.appends = 0

    def entry_counts(self) -> dict[str, int]:
        """Entry-scope events by kind, every kind present."""
        return {k: self.counts.get(k, 0) for k in EVENT_KINDS}

    def all_counts(self) -> dict[str, int]:
        """Entry-scope and cache-scope (``cache_<kind>``) events by kind, every kind present."""
        return {**self.entry_counts(), **{f"cache_{k}": self.counts.get(f"cache_{k}", 0) for k in EVENT_KINDS}}

    def take(self) -> list[Event]:
        """Pop every buffered event, oldest first."""
        out = list(self.buffer)
        self.buffer.clear()
        return out
