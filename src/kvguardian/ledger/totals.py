"""Totals of the ledger kept as entries change, so a scrape reads them in O(1): bytes and entries by state, the
bytes of entries whose owner has ended, the released counters, and the entries that may hold unused bytes
(only those are visited for the fragmentation ratio). `LedgerTotals` is what `Ledger.totals()` returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from kvguardian._errors import InternalError
from kvguardian.ledger.records import INDEXED, EntryState, Record

__all__ = ["LedgerTotals", "StateTotals", "unused_bytes"]


class LedgerTotals(NamedTuple):
    """Aggregates of the ledger at one moment, computed without copying records (for scrapes).

    Ratios follow the same definitions as `LedgerSnapshot.residency_ratio` / `fragmentation_ratio`.
    """

    bytes_by_state: dict[str, int]  # live / retained / orphaned storage bytes
    entries_by_state: dict[str, int]
    residency_ratio: float
    fragmentation_ratio: float
    requests_active: int
    generation: int
    event_counts: dict[str, int]
    events_dropped: int
    instrumentation_errors: dict[str, int]
    released_entries: int
    released_bytes: int


def unused_bytes(records: Iterable[Record]) -> int:
    """Sum of `Record.unused_bytes` (inlined: this runs on every scrape)."""
    unused = 0
    for rec in records:
        size = rec.storage_bytes
        filled = rec.filled_tokens
        cap = rec.capacity_tokens
        if filled is not None and cap:
            used = size * (filled if filled < cap else cap) // cap
            if size > used:
                unused += size - used
        elif size > rec.logical_bytes:
            unused += size - rec.logical_bytes
    return unused


class StateTotals:
    """Bytes and entries by state of the indexed entries, and what the ratios need. The entry table updates
    it wherever an entry is indexed, changes state or storage, or is released; `check` recomputes it."""

    def __init__(self) -> None:
        self.bytes: dict[EntryState, int] = dict.fromkeys(INDEXED, 0)
        self.count: dict[EntryState, int] = dict.fromkeys(INDEXED, 0)
        # entries that had capacity or a view smaller than their storage when last observed: every other
        # entry's unused bytes are 0 (see Record.unused_bytes)
        self.partial: dict[int, Record] = {}
        self.ended_bytes = 0  # bytes of indexed entries whose owner has ended
        self.released_entries = 0  # storages released (an entry continuing with a new storage releases one)
        self.released_bytes = 0

    def add(self, rec: Record) -> None:
        """``rec`` is indexed."""
        self.bytes[rec.state] += rec.storage_bytes
        self.count[rec.state] += 1
        if rec.capacity_tokens or rec.logical_bytes < rec.storage_bytes:
            self.partial[rec.entry_id] = rec

    def remove(self, rec: Record) -> None:
        """``rec`` leaves the index (released): its storage's bytes are counted as released."""
        self.bytes[rec.state] -= rec.storage_bytes
        self.count[rec.state] -= 1
        self.partial.pop(rec.entry_id, None)
        self.released_entries += 1
        self.released_bytes += rec.storage_bytes

    def move(self, rec: Record, state: EntryState) -> None:
        """Change an indexed entry's state, and the totals by state with it."""
        old = rec.state
        if old is not state:
            size = rec.storage_bytes
            self.bytes[old] -= size
            self.bytes[state] += size
            self.count[old] -= 1
            self.count[state] += 1
            rec.state = state

    def as_totals(self) -> tuple[dict[str, int], dict[str, int], float, float]:
        """(bytes by state, entries by state, residency ratio, fragmentation ratio) by state name."""
        live, retained, orphaned = EntryState.LIVE, EntryState.RETAINED, EntryState.ORPHANED
        sb, sn = self.bytes, self.count
        total = sb[live] + sb[retained] + sb[orphaned]
        return (
            {"live": sb[live], "retained": sb[retained], "orphaned": sb[orphaned]},
            {"live": sn[live], "retained": sn[retained], "orphaned": sn[orphaned]},
            (sb[retained] + sb[orphaned]) / total if total else 0.0,
            unused_bytes(self.partial.values()) / total if total else 0.0,
        )

    def check(self, by_id: dict[int, Record]) -> None:
        """Raise `InternalError` unless the totals equal a recomputation over the indexed entries ``by_id``."""
        by_bytes = dict.fromkeys(INDEXED, 0)
        by_n = dict.fromkeys(INDEXED, 0)
        for rec in by_id.values():
            by_bytes[rec.state] += rec.storage_bytes
            by_n[rec.state] += 1
        if by_bytes != self.bytes or by_n != self.count:
            raise InternalError(f"ledger bug: totals by state {self.bytes} {self.count} != "
                                f"recomputed {by_bytes} {by_n}")
        if any(by_id.get(eid) is not rec for eid, rec in self.partial.items()):
            raise InternalError("ledger bug: a released entry is still among the partial entries")
        if unused_bytes(by_id.values()) != unused_bytes(self.partial.values()):
            raise InternalError("ledger bug: an entry with unused bytes is missing from the partial entries")
