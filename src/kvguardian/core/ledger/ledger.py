"""The `Ledger`: the one record of KV entries and their lifecycle events, behind one lock.

A KV entry is one unit of KV memory: a layer's K or V storage, a pool block, or anything a source adds. Tensor
entries are keyed by their storage's data pointer (views count once), and the ledger never holds a strong
reference to a tensor (`releases`). Sources write (requests, `observe`/`observe_kv` for tensors, `add_entry` for
anything else, and the `slots` and `notes` facets); detectors read `snapshot()`; sinks read snapshots, `totals()`
and events. Details: docs/design/ledger.md.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from kvguardian.core.callsite import user_site
from kvguardian.core.errors import UsageError
from kvguardian.core.ledger.events import Event, EventBuffer
from kvguardian.core.ledger.fields import site_of
from kvguardian.core.ledger.notes import Notes
from kvguardian.core.ledger.records import NO_FILL, EntrySite, EntryState, EntryView, Record, RequestInfo, Update
from kvguardian.core.ledger.releases import ReleaseQueue
from kvguardian.core.ledger.renamed import renamed
from kvguardian.core.ledger.slots import Slots
from kvguardian.core.ledger.snapshot import LedgerSnapshot
from kvguardian.core.ledger.table import EntryTable
from kvguardian.core.ledger.tensors import TensorEntries
from kvguardian.core.ledger.timeline import Timeline, timeline_json
from kvguardian.core.ledger.totals import LedgerTotals

if TYPE_CHECKING:
    import torch
    from typing_extensions import Unpack

    from kvguardian.core.ledger.fields import BlockFields

__all__ = ["Ledger"]


class Ledger:
    """One record per KV entry, lifecycle events in a bounded buffer, and no strong reference to any tensor.

    Args:
        event_capacity: events kept before the oldest are dropped (and counted as dropped).
        request_history: ended requests remembered after their last entry was released.
        series_capacity: request-end samples kept for the growth trend test.
        timeline_capacity, timeline_interval, timeline_lanes: the report's timeline (`timeline`): samples kept,
            seconds between interval samples, requests whose span it keeps.
        clock: monotonic clock, injectable for tests.

    Attributes:
        slots: what a source does with the entries filling its slots (`Slots`).
        notes: what sources report besides entries (`Notes`).
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
        self._series: deque[tuple[float, str, int]] = deque(maxlen=series_capacity)
        self.slots: Slots = Slots(self._lock, self._table, self._releases, self._tensors, clock)
        self.notes: Notes = Notes(self._lock, self._table, self._events, clock)
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

    def begin_batch(self) -> None:
        """Observe several slots' updates (one forward's layers) before applying the releases that happened
        meanwhile; every call is paired with one `end_batch`. A forward replaces every layer's storage before its
        updates are observed: applying the old storages' releases at the first observation would close the other
        layers' entries and open new ones, where observing first lets each entry continue with its new storage.
        (Not a context manager: on the per-forward path a generator's set-up costs as much as a layer's
        observation.)"""
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

    # ------------------------------------------------------------------ reading
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
                event_counts=self._events.all_counts(),
                events_dropped=self._events.dropped,
                released_entries=table.totals.released_entries,
                released_bytes=table.totals.released_bytes,
                **self.notes.copied(),
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
                instrumentation_errors=self.notes.errors(),
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

    def __getattr__(self, name: str) -> Any:
        """The names this class had before its surface was cut (0.x): each still works, with a
        `DeprecationWarning` that names its replacement (`kvguardian.core.ledger.renamed`)."""
        return renamed(self, name)
