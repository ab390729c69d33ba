"""`LedgerSnapshot`: an immutable copy of the ledger at one moment, what detectors and sinks read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvguardian.core.ledger.records import EntryState, Record, RequestInfo

__all__ = ["LedgerSnapshot"]


@dataclass(frozen=True)
class LedgerSnapshot:
    """An immutable copy of the ledger at one moment: what detectors and sinks read."""

    taken: float  # time.monotonic() when it was taken
    generation: int  # the model generation at that moment
    records: tuple[Record, ...]  # copies of the live, retained and orphaned entries (released ones are gone)
    requests: dict[str, RequestInfo]  # copies, by request id: active ones and the remembered ended ones
    retained_series: tuple[tuple[float, str, int], ...]  # (time, request id, ended-owner bytes) per request end
    grad_observations: tuple[dict[str, Any], ...]  # evidence of grad-tracked KV, per request (bounded)
    event_counts: dict[str, int]  # entry-scope and cache-scope ("cache_<kind>") events by kind
    events_dropped: int  # events pushed out of the bounded buffer
    instrumentation_errors: dict[str, int]  # contained (fail-open) errors by hook site
    released_entries: int  # storages released so far
    released_bytes: int
    unknown_classes: dict[str, str] = field(default_factory=dict)  # classes a source audits generically -> why
    unknown_sites: dict[str, str | None] = field(default_factory=dict)  # the same -> the user's line first met at

    def by_state(self, state: EntryState) -> list[Record]:
        return [r for r in self.records if r.state is state]

    def bytes_by_state(self) -> dict[str, int]:
        out = {s.value: 0 for s in EntryState if s is not EntryState.RELEASED}
        for r in self.records:
            out[r.state.value] += r.storage_bytes
        return out

    def total_bytes(self) -> int:
        return sum(r.storage_bytes for r in self.records)

    def residency_ratio(self) -> float:
        """KV bytes whose owner has ended / all KV bytes (docs/design/ledger.md). 0.0 when nothing is tracked."""
        total = self.total_bytes()
        if total == 0:
            return 0.0
        ended = sum(r.storage_bytes for r in self.records if r.state is not EntryState.LIVE)
        return ended / total

    def fragmentation_ratio(self) -> float:
        """KV bytes allocated but holding no token / KV bytes allocated (docs/design/ledger.md)."""
        total = self.total_bytes()
        if total == 0:
            return 0.0
        return sum(r.unused_bytes for r in self.records) / total

    def summary(self) -> dict[str, Any]:
        b = self.bytes_by_state()
        return {
            "entries": len(self.records),
            "bytes": b,
            "total_bytes": sum(b.values()),
            "residency_ratio": round(self.residency_ratio(), 6),
            "fragmentation_ratio": round(self.fragmentation_ratio(), 6),
            "requests_active": sum(1 for r in self.requests.values() if r.active),
            "requests_seen": len(self.requests),
            "generation": self.generation,
            "released_entries": self.released_entries,
            "released_bytes": self.released_bytes,
            "events": self.event_counts,
            "events_dropped": self.events_dropped,
            "instrumentation_errors": sum(self.instrumentation_errors.values()),
        }
