"""`Slots`: what a source does with the entries filling its slots (a cache layer's K and V), as a facet of
`Ledger` (``ledger.slots``).

A slot is a logical place a source names in its `EntrySite` (cache id, layer, kind); the entry filling it goes on
with a newer storage when the old one is freed. Sources that sample decode steps, write in place or read fill
counters use these; the one-off tensor path is `Ledger.observe` / `Ledger.observe_kv`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable

from kvguardian.core.ledger.records import NO_FILL, EntrySite, RequestInfo, Update
from kvguardian.core.ledger.releases import ReleaseQueue
from kvguardian.core.ledger.table import EntryTable
from kvguardian.core.ledger.tensors import TensorEntries

__all__ = ["Slots"]


class Slots:
    """The slot-keyed operations of one ledger, under its lock."""

    def __init__(self, lock: threading.RLock, table: EntryTable, releases: ReleaseQueue, tensors: TensorEntries,
                 clock: Callable[[], float]) -> None:
        self._lock = lock
        self._table = table
        self._releases = releases
        self._touch_tensors = tensors.touch  # bound once: touch runs per layer per decode step
        self._clock = clock

    def touch(self, sites: tuple[EntrySite, EntrySite], request: RequestInfo | None,
              update: Update = NO_FILL) -> bool:
        """`Ledger.observe_kv` of a layer whose keys and values are the very tensor objects the source observed
        last (a static cache's, written in place; grad mode off): the entries' fill, time and append, without
        reading the tensors. Returns False, changing nothing, when either entry's storage is gone or the slot has
        none: then the source calls `Ledger.observe_kv`."""
        lock = self._lock
        lock.acquire()  # not `with`: the context-manager protocol costs as much as the rest of this path
        try:
            return self._touch_tensors(sites, request, update, self._clock())
        finally:
            lock.release()

    def follow(self, slots: Iterable[Hashable], *, on: bool = True, at: float | None = None) -> None:
        """The source observes the entries filling ``slots`` only now and then (decode steps, sampled). While
        followed, an entry whose storage dies has moved on to a newer storage in its slot: it stays live with its
        last observed size until the source observes the slot again. ``on=False`` when the source has observed
        them again, or their holder died at ``at``: a followed entry whose storage is gone is released then."""
        with self._lock:
            self._table.follow(slots, on, at)

    def skipped(self, n: int) -> None:
        """Count ``n`` appends the source saw but did not observe one by one (a sampled cache's skipped steps)."""
        with self._lock:
            self._table.events.appends += n

    def fill(self, slots: Iterable[Hashable], filled_tokens: int) -> None:
        """The entries filling ``slots`` hold ``filled_tokens`` tokens now (the source read its counters)."""
        with self._lock:
            by_slot = self._table.slots
            refill = self._table.totals.refill
            for slot in slots:
                rec = by_slot.get(slot)
                if rec is not None:
                    refill(rec, rec.storage_bytes, rec.logical_bytes, filled_tokens)

    def key(self, slot: Hashable) -> Hashable | None:
        """The key (storage address) of the entry filling ``slot``, pending releases applied first (None: no
        entry). A source compares it with what the slot's holder holds now to see a storage replaced behind its
        back: observed then, it gets an entry of its own, not the freed one's."""
        with self._lock:
            table = self._table
            if self._releases.freed and not table.batch:
                table.drain()
            rec = table.slots.get(slot)
            return rec.key if rec is not None else None

    def nbytes(self, slots: Iterable[Hashable]) -> int:
        """Storage bytes of the entries filling ``slots`` now."""
        with self._lock:
            by_slot = self._table.slots
            total = 0
            for slot in slots:
                rec = by_slot.get(slot)
                if rec is not None:
                    total += rec.storage_bytes
            return total
