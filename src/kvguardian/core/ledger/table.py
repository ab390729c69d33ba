"""The entry table: the index of live entries and the state changes every kind of entry goes through.

Entries are indexed by key (storage data pointer or the source's key), by id, and by slot (the logical place a
storage fills: a cache layer's keys). This module owns the transitions - indexed (init or append), used by its
owner (append) or by a later request (hit), owner ended (retained or orphaned), released - and keeps the totals,
the event buffer and the request registry in step with them. Every method runs with the ledger's lock held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from kvguardian.core import faults as _faults
from kvguardian.core.errors import InternalError, UsageError
from kvguardian.core.ledger.events import EventBuffer
from kvguardian.core.ledger.records import EntrySite, EntryState, EntryView, Record, RequestInfo, Update
from kvguardian.core.ledger.releases import ReleaseQueue, StorageRef
from kvguardian.core.ledger.totals import StateTotals

__all__ = ["EntryTable"]


class EntryTable:
    """The index of live entries, the requests that own them, and every entry state change (lock held)."""

    def __init__(self, *, events: EventBuffer, releases: ReleaseQueue, request_history: int,
                 clock: Callable[[], float]) -> None:
        self.clock = clock
        self.events = events
        self.releases = releases
        self.totals = StateTotals()
        self.by_key: dict[Hashable, Record] = {}  # indexed (not released) entries by storage pointer / key
        self.by_id: dict[int, Record] = {}
        self.slots: dict[Hashable, Record] = {}  # slot -> the entry currently filling it
        # slots whose storage was freed and not replaced yet: a replacement before the next read is growth
        # (DynamicLayer's cat), not a release (see release / flush_vacated)
        self.vacated: dict[Hashable, tuple[Record, float, str | None]] = {}
        self.vacated_limit = 4_096
        self.requests: OrderedDict[str, RequestInfo] = OrderedDict()
        self.request_history = request_history  # ended requests remembered after their last entry went
        self.generation = 0  # the model generation new entries belong to
        self.batch = 0  # > 0 inside Ledger.begin_batch() ... end_batch(): releases wait for its end
        # entry id -> (weak reference, time of death) of a following entry's storage that died: the release is
        # postponed until the source observes the slot again (it continues) or stops following it (`follow`)
        self.postponed: dict[int, tuple[Any, float]] = {}
        self.on_release_error: Callable[[str, BaseException], None] | None = None
        self.on_request_freed: Callable[[str, float], None] | None = None  # (request id, when) its last KV went
        self._next_id = 1

    def live(self, key: Hashable, fix: str) -> Record:
        """The live entry of ``key`` (releases applied first). Raises `UsageError` naming ``fix`` if none."""
        if self.releases.freed:
            self.drain()
        rec = self.by_key.get(key)
        if rec is None:
            raise UsageError(f"no live entry with key {key!r}; fix: {fix}")
        return rec

    # ------------------------------------------------------------------ transitions
    def create(self, key: Hashable, site: EntrySite, request: RequestInfo | None, view: EntryView,
               update: Update) -> Record:
        """A new entry at ``site`` for ``request``, indexed; its first event is init, or append when it takes over
        a slot. The caller sets its ``wref`` when something's death must release it."""
        now = self.clock()
        eid = self._next_id
        self._next_id += 1
        rec = Record(
            entry_id=eid, key=key, kind=site.kind, layer=site.layer,
            request_id=request.request_id if request is not None else None,
            tenant=request.tenant if request is not None else None,
            generation=self.generation, source=site.source, shape=view.shape, dtype=view.dtype,
            device=view.device, logical_bytes=view.logical_bytes, storage_bytes=view.storage_bytes, created=now,
            last_access=now, slot=site.slot, filled_tokens=update.filled_tokens,
            capacity_tokens=update.capacity_tokens, grad=view.grad, role=site.role, cache=site.cache,
        )
        self.by_key[rec.key] = rec
        self.by_id[eid] = rec
        self.totals.add(rec)
        if request is not None:
            request.entry_ids.add(eid)
            if request.ended is not None:  # an entry created for an ended request (late hook): ended at birth
                self.late_owner(rec, request)
        slot = rec.slot
        kind = "init"
        if slot is not None:
            prev = self.slots.get(slot)
            self.slots[slot] = rec
            if prev is None and self.vacated.pop(slot, None) is not None:
                kind = "append"  # the slot's previous storage was freed just before: growth by replacement
            elif prev is not None and prev is not rec:
                prev.superseded = True  # still alive: something besides the cache holds the old storage
                kind = "append"
                if prev.follows:  # the slot is followed (`follow`), not the old storage: its death is a release
                    prev.follows = False
                    rec.follows = True
                    item = self.postponed.pop(prev.entry_id, None)
                    if item is not None and prev.wref is item[0]:  # already dead: released when it died
                        self.apply_release(prev, item[1])
        self.events.entry_event(now, kind, rec, None)
        return rec

    def touch(self, rec: Record, request: RequestInfo | None, now: float) -> None:
        """``rec`` was used by ``request``: an append by its owner, or a hit that moves ownership."""
        if request is None or rec.request_id == request.request_id:
            # Appends are coalesced per entry and owner: the first one is an event in the buffer, the rest
            # (one per layer and decode step) are counted on the buffer and on the record.
            if rec.appends:
                rec.appends += 1
                self.events.appends += 1
            else:
                rec.appends = 1
                self.events.entry_event(now, "append", rec, None)
            return
        # a hit: a later request reuses this entry; ownership moves to it
        previous = rec.request_id
        old = self.requests.get(previous) if previous is not None else None
        if old is not None:
            old.entry_ids.discard(rec.entry_id)
            if old.ended is not None:
                self.totals.ended_bytes -= rec.storage_bytes
        rec.request_id = request.request_id
        rec.tenant = request.tenant
        self.totals.move(rec, EntryState.LIVE)
        rec.appends = 0
        request.entry_ids.add(rec.entry_id)
        if request.ended is not None:
            self.late_owner(rec, request)
        self.events.entry_event(now, "hit", rec, previous)

    def end_owner(self, rec: Record) -> None:
        """``rec``'s owner ended: retained when declared, else orphaned."""
        self.totals.move(rec, EntryState.RETAINED if rec.retained_reason else EntryState.ORPHANED)
        self.totals.ended_bytes += rec.storage_bytes

    def late_owner(self, rec: Record, request: RequestInfo) -> None:
        """``rec`` was created for, or reused by, a request that has already ended (a late hook): it is ended at
        once, and the request is registered again if the registry forgot it (pruned), so that releasing the
        entry finds its owner and the ended bytes stay exact."""
        self.requests.setdefault(request.request_id, request)
        self.end_owner(rec)

    def release(self, rec: Record, ts: float, detail: str | None) -> None:
        """``rec``'s storage (or entry) is gone: it leaves the index; its release event may wait (vacated)."""
        eid = rec.entry_id
        del self.by_id[eid]
        if rec.follows:
            rec.follows = False
            self.postponed.pop(eid, None)
        self.totals.remove(rec)
        if self.by_key.get(rec.key) is rec:
            del self.by_key[rec.key]
        if rec.request_id is not None:
            info = self.requests.get(rec.request_id)
            if info is not None:
                if rec.state is not EntryState.LIVE and info.ended is not None:
                    self.totals.ended_bytes -= rec.storage_bytes
                info.entry_ids.discard(eid)
                if info.ended is not None and not info.entry_ids and self.on_request_freed is not None:
                    self.on_request_freed(info.request_id, ts)  # the ended request's last KV is gone
        rec.state = EntryState.RELEASED
        rec.released_at = ts
        slot = rec.slot
        if slot is not None and self.slots.get(slot) is rec:
            # Wait: if a new storage fills this slot before the ledger is read, this was a replacement
            # (DynamicLayer's cat), not a release. flush_vacated emits the release otherwise.
            del self.slots[slot]
            self.vacated[slot] = (rec, ts, detail)
            if len(self.vacated) > self.vacated_limit:
                self.flush_vacated()
        elif not rec.superseded:
            self.events.entry_event(ts, "release", rec, detail)
        if len(self.requests) > self.request_history:
            self.prune_requests()

    def flush_vacated(self) -> None:
        """Slots whose storage was freed and not replaced since: the cache let go of them (release)."""
        while self.vacated:
            _, (rec, ts, detail) = self.vacated.popitem()
            self.events.entry_event(ts, "release", rec, detail)

    def drain(self) -> None:
        """Apply the releases queued by weak-reference callbacks."""
        freed = self.releases.freed
        by_id = self.by_id
        while freed:
            wref, ts = freed.popleft()
            rec = by_id.get(wref.eid)
            if rec is None or rec.wref is not wref:
                continue  # a storage the entry no longer tracks (it continued) or an entry already released
            if rec.follows:
                self.postpone(rec, wref, ts)
                continue
            self.apply_release(rec, ts)

    def apply_release(self, rec: Record, ts: float) -> None:
        """Release ``rec``, whose storage died at ``ts`` (fail open: a failure leaves it unreleased, reported)."""
        if _faults.FAULTS:
            try:
                _faults.maybe_fail("release")
            except Exception as exc:  # fail open: the release is not applied (counted by the handler)
                handler = self.on_release_error
                if handler is not None:
                    handler("release", exc)
                return
        self.release(rec, ts, "superseded" if rec.superseded else None)

    def postpone(self, rec: Record, wref: StorageRef, ts: float) -> None:
        """The storage of ``rec``, a following entry, died at ``ts``: its slot holds a newer storage its source
        has not observed yet. The entry stays live with its last observed size; it leaves the address index (the
        address may be reused by any new storage) until the source observes the slot again."""
        self.postponed[rec.entry_id] = (wref, ts)
        if self.by_key.get(rec.key) is rec:
            del self.by_key[rec.key]

    def follow(self, slots: Iterable[Hashable], on: bool, at: float | None) -> None:
        """Start (``on``) or stop following the entries filling ``slots``. Stopping applies the postponed
        release of an entry whose last observed storage died and was not replaced by an observation since, at
        ``at`` (the slot's owner died then) or else when that storage died."""
        if not on and self.releases.freed:
            self.drain()  # deaths not applied yet are postponed first, then applied below
        by_slot = self.slots
        postponed = self.postponed
        for slot in slots:
            rec = by_slot.get(slot)
            if rec is None:
                continue
            if on:
                rec.follows = True
                continue
            rec.follows = False
            item = postponed.pop(rec.entry_id, None)
            if item is not None and rec.wref is item[0]:
                self.apply_release(rec, item[1] if at is None else max(at, item[1]))

    def settle(self) -> None:
        """Apply pending releases and decide vacated slots (before reads and at request boundaries)."""
        if self.releases.freed:
            self.drain()
        self.flush_vacated()
        self.events.fold_appends()

    def retain(self, keys: Iterable[Hashable] | None, reason: str | None) -> int:
        """Mark the live entries of ``keys`` (None: every entry) retained for ``reason``, or clear the mark
        (``reason`` None); ended entries move between retained and orphaned. Returns how many were marked."""
        if self.releases.freed:
            self.drain()
        by_key = self.by_key
        recs = list(by_key.values()) if keys is None else [by_key[k] for k in keys if k in by_key]
        for rec in recs:
            rec.retained_reason = reason
            if reason is not None and rec.state is EntryState.ORPHANED:
                self.totals.move(rec, EntryState.RETAINED)
            elif reason is None and rec.state is EntryState.RETAINED:
                self.totals.move(rec, EntryState.ORPHANED)
        return len(recs)

    # ------------------------------------------------------------------ requests
    def begin_request(self, request_id: str, tenant: str | None, implicit: bool, now: float,
                      site: str | None = None) -> RequestInfo:
        """Register a new request (settled first). Raises `UsageError` if one with this id is still active."""
        self.settle()
        old = self.requests.get(request_id)
        if old is not None and old.active:
            raise UsageError(
                f"request {request_id!r} is already active; fix: use a unique id per request "
                "or end the first one before starting another"
            )
        info = RequestInfo(request_id=request_id, tenant=tenant, generation=self.generation, started=now,
                           implicit=implicit, site=site)
        self.requests[request_id] = info
        self.requests.move_to_end(request_id)
        self.totals.requests_active += 1
        return info

    def end_request(self, request_id: str, now: float) -> RequestInfo:
        """End a request (settled first): its live entries become retained (declared) or orphaned."""
        self.settle()
        info = self.requests.get(request_id)
        if info is None or not info.active:
            raise UsageError(f"request {request_id!r} is not active; fix: end each request exactly once")
        info.ended = now
        self.totals.requests_active -= 1
        for eid in list(info.entry_ids):
            rec = self.by_id.get(eid)
            if rec is None:
                info.entry_ids.discard(eid)
                continue
            self.end_owner(rec)
        self.prune_requests()
        return info

    def prune_requests(self) -> None:
        """Forget the oldest ended requests with no entries once over the history bound."""
        excess = len(self.requests) - self.request_history
        if excess <= 0:
            return
        for rid in list(self.requests):
            if excess <= 0:
                break
            info = self.requests[rid]
            if not info.active and not info.entry_ids:
                del self.requests[rid]
                excess -= 1

    # ------------------------------------------------------------------ invariants
    def check(self) -> None:
        """Raise `InternalError` if the indexes, the owners' entry lists or the totals disagree."""
        # a following entry whose observed storage died is out of the address index until observed again
        waiting = {eid for eid, (wref, _) in self.postponed.items()
                   if eid in self.by_id and self.by_id[eid].follows and self.by_id[eid].wref is wref}
        if set(self.by_id) != {r.entry_id for r in self.by_key.values()} | waiting:
            raise InternalError("ledger bug: the indexes by id and by key disagree")
        if any(rec.entry_id != eid for eid, rec in self.by_id.items()):
            raise InternalError("ledger bug: an entry is indexed under another entry's id")
        ended = 0
        for rec in self.by_id.values():
            if rec.state is EntryState.RELEASED:
                raise InternalError(f"ledger bug: released {rec!r} still indexed")
            ended += self._check_owner(rec)
        if ended != self.totals.ended_bytes:
            raise InternalError(f"ledger bug: ended bytes {self.totals.ended_bytes} != recomputed {ended}")
        self.totals.check(self.by_id, sum(1 for r in self.requests.values() if r.active))

    def _check_owner(self, rec: Record) -> int:
        """Check ``rec`` against its owner; return its bytes when the owner has ended."""
        if rec.request_id is None:
            return 0
        info = self.requests.get(rec.request_id)
        if info is None or rec.entry_id not in info.entry_ids:
            raise InternalError(f"ledger bug: {rec!r} owner {rec.request_id!r} does not list it")
        if info.active:
            return 0
        if rec.state is EntryState.LIVE:
            raise InternalError(f"ledger bug: {rec!r} is live but its owner ended")
        return rec.storage_bytes
