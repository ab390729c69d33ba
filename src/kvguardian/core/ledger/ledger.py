"""The `Ledger`: the one record of KV entries and their lifecycle events, behind one lock.

A KV entry is one unit of KV memory: a layer's K or V storage, a pool block, or anything a source adds. Tensor
entries are keyed by their storage's data pointer (views count once), and the ledger never holds a strong
reference to a tensor (`releases`). Sources write; detectors read `snapshot()`; sinks read snapshots, `totals()`
and events. Details: docs/design/ledger.md.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from kvguardian.core.callsite import user_site, warn_at_user
from kvguardian.core.errors import UsageError
from kvguardian.core.ledger.events import EVENT_KINDS, Event, EventBuffer
from kvguardian.core.ledger.fields import cache_event, site_of
from kvguardian.core.ledger.records import NO_FILL, EntrySite, EntryState, EntryView, Record, RequestInfo, Update
from kvguardian.core.ledger.releases import ReleaseQueue
from kvguardian.core.ledger.snapshot import LedgerSnapshot
from kvguardian.core.ledger.table import EntryTable
from kvguardian.core.ledger.tensors import TensorEntries
from kvguardian.core.ledger.timeline import Timeline, timeline_json
from kvguardian.core.ledger.totals import LedgerTotals

if TYPE_CHECKING:
    import torch
    from typing_extensions import Unpack

    from kvguardian.core.ledger.fields import BlockFields, CacheEventFields, EntryFields

__all__ = ["Ledger"]


class Ledger:
    """One record per KV entry, lifecycle events in a bounded buffer, and no strong reference to any tensor.

    Args:
        event_capacity: events kept before the oldest are dropped (and counted as dropped).
        request_history: ended requests remembered after their last entry was released.
        series_capacity: request-end samples kept for the growth trend test.
        timeline_capacity: samples of KV bytes by state kept for the report's timeline (`kvguardian.core.ledger.
            timeline`: when full, pairs are merged and the sampling interval doubles).
        timeline_interval: seconds between the timeline's interval samples (besides one per request end).
        timeline_lanes: requests whose span the timeline keeps.
        clock: monotonic clock, injectable for tests.
    """

    def __init__(
        self,
        *,
        event_capacity: int = 65_536,
        request_history: int = 4_096,
        series_capacity: int = 4_096,
        timeline_capacity: int = 2_048,
        timeline_interval: float = 1.0,
        timeline_lanes: int = 4_096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if event_capacity < 1 or request_history < 1 or series_capacity < 1:
            raise UsageError("Ledger capacities must be >= 1; fix: pass positive event_capacity/request_history")
        self._lock = threading.RLock()
        self._clock = clock
        self._events = EventBuffer(event_capacity)
        self._releases = ReleaseQueue(clock)
        self._table = EntryTable(events=self._events, releases=self._releases, request_history=request_history,
                                 clock=clock)
        self._tensors = TensorEntries(self._table)
        self._observe_tensor = self._tensors.observe  # bound once: observe_kv runs per layer per decode step
        self._touch_tensors = self._tensors.touch
        self._series: deque[tuple[float, str, int]] = deque(maxlen=series_capacity)
        self._grad_obs: deque[dict[str, Any]] = deque(maxlen=256)
        self.instrumentation_errors: Counter[str] = Counter()
        self._unknown: dict[str, str] = {}  # class a source audits through a generic path -> why (bounded)
        self._unknown_sites: dict[str, str | None] = {}  # the same classes -> the user's line first met at
        self._timeline = Timeline(clock(), capacity=timeline_capacity, interval_s=timeline_interval,
                                  lanes=timeline_lanes)
        self._table.on_request_freed = self._timeline.freed

    # ------------------------------------------------------------------ public state
    @property
    def clock(self) -> Callable[[], float]:
        """The ledger's monotonic clock: sources time what they report with it."""
        return self._clock

    @property
    def generation(self) -> int:
        """The model generation new entries belong to (`bump_generation`)."""
        return self._table.generation

    @property
    def events_dropped(self) -> int:
        return self._events.dropped

    @property
    def released_entries(self) -> int:
        return self._table.totals.released_entries

    @property
    def released_bytes(self) -> int:
        return self._table.totals.released_bytes

    def set_release_error_handler(self, handler: Callable[[str, BaseException], None] | None) -> None:
        """Who is told when applying a storage's release fails (fail-open: the guard counts and logs it)."""
        self._table.on_release_error = handler

    # ------------------------------------------------------------------ requests
    def begin_request(self, request_id: str, tenant: str | None = None, *, implicit: bool = False) -> RequestInfo:
        """Start a request, noting the user's line that began it (`callsite.user_site`). Raises `UsageError` if a
        request with this id is still active."""
        site = user_site()
        with self._lock:
            now = self._clock()
            info = self._table.begin_request(request_id, tenant, implicit, now, site)
            self._timeline.begin(request_id, tenant, now)
            self._timeline.tick(now, self._table.totals)
            return info

    def end_request(self, request_id: str) -> RequestInfo:
        """End a request: its live entries become retained (declared) or orphaned; sample ended bytes."""
        with self._lock:
            now = self._clock()
            self._table.settle()
            self._timeline.take(now, self._table.totals, request_end=True)  # still live: the peak shows
            info = self._table.end_request(request_id, now)
            self._series.append((now, request_id, self._table.totals.ended_bytes))
            by_id = self._table.by_id
            self._timeline.end(request_id, now, sum(by_id[e].storage_bytes for e in info.entry_ids if e in by_id))
            self._timeline.take(now, self._table.totals, request_end=True)
            return info

    def request(self, request_id: str) -> RequestInfo | None:
        return self._table.requests.get(request_id)

    def active_requests(self) -> list[RequestInfo]:
        with self._lock:
            return [r for r in self._table.requests.values() if r.active]

    def ended_owners(self) -> int:
        """Ended requests that still own entries (settled)."""
        with self._lock:
            self._table.settle()
            return sum(1 for r in self._table.requests.values() if r.ended is not None and r.entry_ids)

    def bump_generation(self) -> int:
        """A model reload: entries created from now on belong to the next generation."""
        with self._lock:
            self._table.generation += 1
            return self._table.generation

    # ------------------------------------------------------------------ tensor entries
    def observe(self, tensor: torch.Tensor, site: EntrySite, request: RequestInfo | None,
                update: Update = NO_FILL) -> Record | None:
        """Record that ``tensor`` (a KV tensor or a view of one), stored at ``site``, is in use by ``request``.

        Returns the entry, or None for an empty tensor (no storage to track).
        """
        with self._lock:
            rec = self._tensors.observe(tensor, site, request, update, self._clock())
            table = self._table
            if self._releases.freed and not table.batch:
                table.drain()
            return rec

    def observe_tensor(self, tensor: torch.Tensor, *, request: RequestInfo | None,
                       **fields: Unpack[EntryFields]) -> Record | None:
        """`observe` with the site and fill by keyword: ``kind``, ``layer``, ``source``, ``slot``, ``role``,
        ``cache``, ``filled_tokens``, ``capacity_tokens``."""
        site, update = site_of(fields)
        return self.observe(tensor, site, request, update)

    def observe_kv(self, keys: torch.Tensor, values: torch.Tensor | None, sites: tuple[EntrySite, EntrySite],
                   request: RequestInfo | None, update: Update = NO_FILL) -> bool:
        """`observe` for one layer's keys and values (``values`` may be None) under one lock: the per-layer,
        per-decode-step hot path of cache instrumentation. Returns whether either entry has seen a tensor that
        requires grad."""
        lock = self._lock
        lock.acquire()  # not `with`: the context-manager protocol costs as much as the rest of a fast path
        try:
            now = self._clock()
            observe = self._observe_tensor
            # releases are applied after, not before: a slot whose storage was just freed (DynamicLayer's cat)
            # then continues with the new storage instead of a release plus a new record
            rec = observe(keys, sites[0], request, update, now)
            grad = rec is not None and rec.grad
            if values is not None:
                rec = observe(values, sites[1], request, update, now)
                grad = (rec is not None and rec.grad) or grad
            if self._releases.freed and not self._table.batch:
                self._table.drain()
                timeline = self._timeline  # about once per decode step (its old storages freed); inlined tick():
                if now >= timeline.next_due:  # a call here was +17 bytecodes per update (bench/hook_ops.py)
                    timeline.take(now, self._table.totals)
        finally:
            lock.release()
        return grad

    def touch_kv(self, sites: tuple[EntrySite, EntrySite], request: RequestInfo | None,
                 update: Update = NO_FILL) -> bool:
        """`observe_kv` of a layer whose keys and values are the very tensor objects the source observed last
        (a static cache's, written in place; grad mode off): the entries' fill, time and append, without reading
        the tensors. Returns False, changing nothing, when either entry's storage is gone or the slot has none:
        then the source calls `observe_kv`."""
        lock = self._lock
        lock.acquire()
        try:
            return self._touch_tensors(sites, request, update, self._clock())
        finally:
            lock.release()

    @contextlib.contextmanager
    def observe_batch(self) -> Iterator[None]:
        """Observe several slots' updates (one forward's layers) before applying the releases that happened
        meanwhile (`begin_batch` ... `end_batch`). A forward replaces every layer's storage before its updates
        are observed; applying the old storages' releases at the first observation would close the other
        layers' entries and open new ones, where observing first lets each entry continue with its new
        storage."""
        self.begin_batch()
        try:
            yield
        finally:
            self.end_batch()

    def begin_batch(self) -> None:
        """`observe_batch` without the context-manager protocol (the per-forward path: a generator's set-up
        costs as much as a layer's observation there); every call is paired with one `end_batch`."""
        with self._lock:
            self._table.batch += 1

    def end_batch(self) -> None:
        """The end of a `begin_batch`: the outermost one applies the releases and takes the interval sample,
        if due."""
        with self._lock:
            table = self._table
            table.batch -= 1
            if not table.batch:
                if self._releases.freed:
                    table.drain()
                now, timeline = self._clock(), self._timeline  # once per forward: the interval sample,
                if now >= timeline.next_due:  # if due (tick() inlined)
                    timeline.take(now, table.totals)

    def follow(self, slots: Iterable[Hashable], *, on: bool = True, at: float | None = None) -> None:
        """A source observes the entries filling ``slots`` only now and then (a cache's decode steps, sampled):
        while followed, an entry whose storage dies is taken to have moved on to a newer storage in its slot,
        not released - it stays live with its last observed size until the source observes the slot again (the
        entry continues with the newer storage). ``on=False`` when the source has observed them again, or the
        object holding the slots died at ``at``: a followed entry whose storage is gone and was not observed
        again is released then."""
        with self._lock:
            self._table.follow(slots, on, at)

    def add_appends(self, n: int) -> None:
        """Count ``n`` appends a source saw but did not observe one by one (a sampled cache's skipped steps)."""
        with self._lock:
            self._table.events.appends += n

    def set_filled(self, slots: Iterable[Hashable], filled_tokens: int) -> None:
        """The entries filling ``slots`` hold ``filled_tokens`` tokens now (a source read its counters)."""
        with self._lock:
            by_slot = self._table.slots
            refill = self._table.totals.refill
            for slot in slots:
                rec = by_slot.get(slot)
                if rec is not None:
                    refill(rec, rec.storage_bytes, rec.logical_bytes, filled_tokens)

    def slot_key(self, slot: Hashable) -> Hashable | None:
        """The key (storage address) of the entry filling ``slot``, pending releases applied first (None: no
        entry): a source compares it with what the slot's holder holds now to see a storage replaced behind its
        back - observed then, it gets an entry of its own (its dtype and device), not the freed one's."""
        with self._lock:
            table = self._table
            if self._releases.freed and not table.batch:
                table.drain()
            rec = table.slots.get(slot)
            return rec.key if rec is not None else None

    def slot_bytes(self, slots: Iterable[Hashable]) -> int:
        """Storage bytes of the entries filling ``slots`` now."""
        with self._lock:
            by_slot = self._table.slots
            total = 0
            for slot in slots:
                rec = by_slot.get(slot)
                if rec is not None:
                    total += rec.storage_bytes
            return total

    # ------------------------------------------------------------------ other entries
    def add_entry(self, key: Hashable, *, nbytes: int, request: RequestInfo | None,
                  **fields: Unpack[BlockFields]) -> Record:
        """Record a non-tensor entry (a pool block, a key) by keyword (``kind``, ``source``, ``layer``, ``shape``,
        ``dtype``, ``device``, ``slot``, ``filled_tokens``, ``capacity_tokens``). Release it with
        `release_entry`, or pass ``watch`` (a weak-referenceable object) to release it when that object dies."""
        site, update = site_of(fields)
        with self._lock:
            table = self._table
            if self._releases.freed:
                table.drain()
            if key in table.by_key:
                raise UsageError(f"entry key {key!r} is already live; fix: release it before adding it again")
            # EntryView(shape, dtype, device, logical_bytes, storage_bytes)
            view = EntryView(fields.get("shape", ()), fields.get("dtype", ""), fields.get("device", ""), nbytes, nbytes)
            rec = table.create(key, site, request, view, update)
            watch = fields.get("watch")
            if watch is not None:
                rec.wref = self._releases.watch(watch, rec.entry_id)
            return rec

    def touch_entry(self, key: Hashable, request: RequestInfo | None, *, filled_tokens: int | None = None) -> None:
        """A non-tensor entry was used (appended to, read) by ``request``."""
        with self._lock:
            rec = self._table.live(key, "add_entry() it first")
            now = self._clock()
            rec.last_access = now
            if filled_tokens is not None:
                self._table.totals.refill(rec, rec.storage_bytes, rec.logical_bytes, filled_tokens)
            self._table.touch(rec, request, now)

    def release_entry(self, key: Hashable, *, detail: str | None = None) -> None:
        """A non-tensor entry was released by its source (a freed block, an expired key)."""
        with self._lock:
            rec = self._table.live(key, "release each entry once")
            now = self._clock()
            self._table.release(rec, now, detail)
            self._timeline.tick(now, self._table.totals)  # a pool has no forward: its frees carry the samples

    # ------------------------------------------------------------------ retention marks
    def retain_keys(self, keys: Iterable[Hashable], reason: str) -> int:
        """Declare entries legitimately retained. Returns how many live entries were marked."""
        if not reason:
            raise UsageError("a retention needs a reason; fix: guard.retain(obj, reason='system prompt cache')")
        with self._lock:
            return self._table.retain(keys, reason)

    def clear_retention(self, keys: Iterable[Hashable] | None = None) -> None:
        """Undo declared retention (all of it, or for ``keys``); ended entries become orphaned again."""
        with self._lock:
            self._table.retain(keys, None)

    # ------------------------------------------------------------------ notes from sources
    def note_grad(self, observation: dict[str, Any]) -> None:
        """Keep the evidence of a grad-tracked KV observation (bounded)."""
        with self._lock:
            self._grad_obs.append(observation)

    def note_error(self, site: str) -> int:
        """Count an instrumentation error at ``site``; returns the count so far for that site."""
        self.instrumentation_errors[site] += 1
        return self.instrumentation_errors[site]

    def note_unknown(self, cls: str, why: str) -> None:
        """A source met a class it does not know (a cache or layer class) and audits it through a generic path,
        because ``why`` (the first reason is kept; at most 256 classes)."""
        with self._lock:
            if cls in self._unknown or len(self._unknown) >= 256:
                return
            self._unknown[cls] = why
            self._unknown_sites[cls] = user_site()
        warn_at_user(f"kv-guardian KVG107: cache class {cls} is not one kv-guardian knows; audited through the "
                     f"generic path ({why})")

    def unknown_sites(self) -> dict[str, str | None]:
        """Class -> the user's line where it was first met (`note_unknown`)."""
        with self._lock:
            return dict(self._unknown_sites)

    def unknown_classes(self) -> dict[str, str]:
        """Class -> why, for every class audited through a generic path (`note_unknown`)."""
        with self._lock:
            return dict(self._unknown)

    def emit_cache_event(self, kind: str, *, cache: str, request: RequestInfo | None,
                         **fields: Unpack[CacheEventFields]) -> None:
        """A lifecycle event about a whole cache object (scope "cache"), reported by a source: init on its
        first prefill, hit when a later request reuses it, evict on crop/reset, release when it is freed.
        ``fields`` are `Event` fields by keyword (``nbytes``, ``layer``, ``detail``, ``shape``, ...) and ``ts``
        (default: now)."""
        if kind not in EVENT_KINDS:
            raise UsageError(f"unknown event kind {kind!r}; use one of {', '.join(EVENT_KINDS)}")
        event = cache_event(kind, cache, request, fields, self._clock)
        with self._lock:
            self._events.cache_event(event)

    # ------------------------------------------------------------------ reading
    def live_keys(self) -> set[Hashable]:
        with self._lock:
            self._table.settle()
            return set(self._table.by_key)

    def records(self, state: EntryState | None = None) -> list[Record]:
        """Copies of the indexed entries (settled), of one state or all."""
        with self._lock:
            self._table.settle()
            return [r.copy() for r in self._table.by_id.values() if state is None or r.state is state]

    def snapshot(self) -> LedgerSnapshot:
        with self._lock:
            table = self._table
            table.settle()
            now = self._clock()
            self._timeline.tick(now, self._table.totals)
            return LedgerSnapshot(
                taken=now,
                generation=table.generation,
                records=tuple(r.copy() for r in table.by_id.values()),
                requests={k: v.copy() for k, v in table.requests.items()},
                retained_series=tuple(self._series),
                grad_observations=tuple(
                    {**o, "layers": list(o.get("layers", ())), "layer_updates": dict(o.get("layer_updates", {}))}
                    for o in self._grad_obs
                ),
                event_counts=self._events.all_counts(),
                events_dropped=self._events.dropped,
                instrumentation_errors=dict(self.instrumentation_errors),
                released_entries=table.totals.released_entries,
                released_bytes=table.totals.released_bytes,
                unknown_classes=dict(self._unknown),
                unknown_sites=dict(self._unknown_sites),
            )

    def timeline(self, snap: LedgerSnapshot) -> dict[str, Any]:
        """The report's KV timeline (`kvguardian.core.report.history` schema) with a sample taken now: samples,
        request lanes with what outlived each request (from ``snap``), the buffered events, the entries alive."""
        with self._lock:
            self._table.settle()
            now = self._clock()
            self._timeline.take(now, self._table.totals)
            events = list(self._events.buffer)
            return timeline_json(self._timeline, now, snap.records, events, events_dropped=self._events.dropped)

    def totals(self) -> LedgerTotals:
        """Bytes and entries by state, the two ratios and the counters, without a pass over the entries or the
        requests: every total is kept as entries and requests change (`kvguardian.core.ledger.totals`), so a scrape
        costs the same at a million entries as at none."""
        with self._lock:
            table = self._table
            table.settle()
            self._timeline.tick(self._clock(), table.totals)  # scrapes come on an interval, also when idle
            by_bytes, by_n, residency, fragmentation = table.totals.as_totals()
            return LedgerTotals(
                bytes_by_state=by_bytes,
                entries_by_state=by_n,
                residency_ratio=residency,
                fragmentation_ratio=fragmentation,
                requests_active=table.totals.requests_active,
                generation=table.generation,
                event_counts=self._events.entry_counts(),
                events_dropped=self._events.dropped,
                instrumentation_errors=dict(self.instrumentation_errors),
                released_entries=table.totals.released_entries,
                released_bytes=table.totals.released_bytes,
                unused_bytes=table.totals.unused,
            )

    def events(self) -> list[Event]:
        """A copy of the buffered events, oldest first."""
        with self._lock:
            self._table.settle()
            return list(self._events.buffer)

    def take_events(self) -> list[Event]:
        """Pop every buffered event (swap the buffer), so a consumer never keeps them twice."""
        with self._lock:
            self._table.settle()
            return self._events.take()

    def __len__(self) -> int:
        with self._lock:
            self._table.settle()
            return len(self._table.by_id)

    def check_invariants(self) -> None:
        """Raise `InternalError` if the ledger's indexes disagree (tests and the auditor call this)."""
        with self._lock:
            self._table.settle()
            self._table.check()
