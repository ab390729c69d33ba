"""Totals of the ledger kept as entries change, so a scrape reads them in O(1), whatever the number of entries:
bytes and entries by state, the bytes of entries whose owner has ended, the unused (allocated but unfilled)
bytes behind the fragmentation ratio, the active requests and the released counters. `LedgerTotals` is what
`Ledger.totals()` returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from kvguardian.core.errors import InternalError
from kvguardian.core.ledger.records import INDEXED, EntryState, Record, unused_of

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
    unused_bytes: int  # storage bytes holding no token (the fragmentation ratio's numerator)


def unused_bytes(records: Iterable[Record]) -> int:
    """Sum of `Record.unused_bytes`: the recomputation `StateTotals.check` compares the running total with."""
    return sum(unused_of(r.storage_bytes, r.logical_bytes, r.filled_tokens, r.capacity_tokens) for r in records)


class StateTotals:
    """Bytes and entries by state of the indexed entries, what the ratios need, and the active requests. The entry
    table updates it wherever an entry is indexed, changes state, storage, view or fill, or is released, and
    wherever a request begins or ends; `check` recomputes it."""

    def __init__(self) -> None:
        self.bytes: dict[EntryState, int] = dict.fromkeys(INDEXED, 0)
        self.count: dict[EntryState, int] = dict.fromkeys(INDEXED, 0)
        # Record.unused_bytes summed over the indexed entries: it changes only where an entry is indexed or
        # released and where `refill` changes its storage, view or fill (an entry with no capacity and a view
        # as large as its storage has none, so most entries never reach `refill`)
        self.unused = 0
        self.ended_bytes = 0  # bytes of indexed entries whose owner has ended
        self.requests_active = 0  # registered requests not ended yet
        self.released_entries = 0  # storages released (an entry continuing with a new storage releases one)
        self.released_bytes = 0

    def add(self, rec: Record) -> None:
        """``rec`` is indexed."""
        self.bytes[rec.state] += rec.storage_bytes
        self.count[rec.state] += 1
        if rec.capacity_tokens or rec.logical_bytes < rec.storage_bytes:  # else it has no unused bytes
            self.unused += rec.unused_bytes

    def remove(self, rec: Record) -> None:
        """``rec`` leaves the index (released): its storage's bytes are counted as released."""
        self.bytes[rec.state] -= rec.storage_bytes
        self.count[rec.state] -= 1
        if rec.capacity_tokens or rec.logical_bytes < rec.storage_bytes:
            self.unused -= rec.unused_bytes
        self.released_entries += 1
        self.released_bytes += rec.storage_bytes

    def refill(self, rec: Record, storage_bytes: int, logical_bytes: int, filled_tokens: int | None) -> None:
        """Set an indexed entry's storage and view bytes and its fill (``filled_tokens`` None: unchanged); the
        unused bytes follow. The bytes by state are the caller's: only a recycled entry's storage changes size."""
        cap = rec.capacity_tokens
        before = unused_of(rec.storage_bytes, rec.logical_bytes, rec.filled_tokens, cap)
        rec.storage_bytes = storage_bytes
        rec.logical_bytes = logical_bytes
        if filled_tokens is None:
            filled_tokens = rec.filled_tokens
        else:
            rec.filled_tokens = filled_tokens
        self.unused += unused_of(storage_bytes, logical_bytes, filled_tokens, cap) - before

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
            self.unused / total if total else 0.0,
        )

    def check(self, by_id: dict[int, Record], requests_active: int) -> None:
        """Raise `InternalError` unless the totals equal a recomputation over the indexed entries ``by_id`` and
        the ``requests_active`` counted in the registry."""
        by_bytes = dict.fromkeys(INDEXED, 0)
        by_n = dict.fromkeys(INDEXED, 0)
        for rec in by_id.values():
            by_bytes[rec.state] += rec.storage_bytes
            by_n[rec.state] += 1
        if by_bytes != self.bytes or by_n != self.count:
            raise InternalError(f"ledger bug: totals by state {self.bytes} {self.count} != "
                                f"recomputed {by_bytes} {by_n}")
        unused = unused_bytes(by_id.values())
        if unused != self.unused:
            raise InternalError(f"ledger bug: unused bytes {self.unused} != recomputed {unused}")
        if requests_active != self.requests_active:
            raise InternalError(f"ledger bug: active requests {self.requests_active} != counted {requests_active}")
