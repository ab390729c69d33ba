"""The keyword forms of what sources report: `Ledger.add_entry` and `Notes.cache_event` take these fields by
keyword and turn them into the small named types here."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypedDict

from kvguardian.core.ledger.events import Event
from kvguardian.core.ledger.records import NO_FILL, EntrySite, RequestInfo, Update

__all__ = ["BlockFields", "CacheEventFields", "EntryFields", "cache_event", "site_of"]


class _Site(TypedDict):
    kind: str  # "k", "v", "block", ...
    source: str  # who reports it


class EntryFields(_Site, total=False):
    """An `EntrySite` and an `Update` by keyword."""

    layer: int | None
    slot: Hashable | None
    role: str | None
    cache: str | None
    filled_tokens: int | None
    capacity_tokens: int | None


class BlockFields(EntryFields, total=False):
    """`EntryFields` of a non-tensor entry, with what a tensor would have told."""

    shape: tuple[int, ...]
    dtype: str
    device: str
    watch: Any  # a weak-referenceable object whose death releases the entry


class CacheEventFields(TypedDict, total=False):
    """The optional `Event` fields of a cache-scope event, and its time (default: now)."""

    ts: float | None
    nbytes: int
    layer: int | None
    detail: str | None
    shape: tuple[int, ...] | None
    dtype: str | None
    device: str | None
    hit_ratio: float | None
    latency_delta: float | None
    first_token_s: float | None


def site_of(fields: EntryFields | BlockFields) -> tuple[EntrySite, Update]:
    """The `EntrySite` and `Update` that ``fields`` describe."""
    # EntrySite(kind, layer, source, slot, role, cache): positional, cheaper than by keyword on every call
    site = EntrySite(fields["kind"], fields.get("layer"), fields["source"], fields.get("slot"), fields.get("role"),
                     fields.get("cache"))
    filled, capacity = fields.get("filled_tokens"), fields.get("capacity_tokens")
    return site, (NO_FILL if filled is None and capacity is None else Update(filled, capacity))


def cache_event(kind: str, cache: str, request: RequestInfo | None, fields: CacheEventFields,
                clock: Callable[[], float]) -> Event:
    """The cache-scope `Event` of ``kind`` about ``cache`` that ``fields`` describe."""
    ts = fields.get("ts")
    return Event(
        ts=clock() if ts is None else ts, kind=kind, entry_id=0,
        request_id=request.request_id if request is not None else None,
        tenant=request.tenant if request is not None else None,
        layer=fields.get("layer"), nbytes=fields.get("nbytes", 0), detail=fields.get("detail"), scope="cache",
        cache=cache, shape=fields.get("shape"), dtype=fields.get("dtype"), device=fields.get("device"),
        hit_ratio=fields.get("hit_ratio"), latency_delta=fields.get("latency_delta"),
        first_token_s=fields.get("first_token_s"),
    )
