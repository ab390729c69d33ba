"""The ledger: the one record of KV entries and their lifecycle events.

A *KV entry* is one unit of KV memory kv-guardian knows about: the storage behind a layer's keys or values
(HF caches, custom models), a block of the paged pool, or anything a source reports with `add_entry`.
Tensor entries are keyed by their storage's data pointer, so views of one storage are one entry and its
bytes are counted once.

The ledger never holds a strong reference to a tensor or storage. It keeps a weak reference with a callback
on ``tensor.untyped_storage()``: the callback runs at the exact moment the storage is deallocated (tensor
weakrefs would not: views and ``detach()`` share the storage). The callback does one thing: it queues the
weak reference itself (which carries its entry id) with the time of death. ``weakref.finalize`` would have the
same timing at twenty times the cost, and the decode loop pays it for every new storage. The ledger applies
queued releases at its next operation, under its lock - within the same cache update while decoding - so a
release that fires inside another ledger call (a GC pass during an allocation) cannot corrupt an iteration;
an entry's release time is still the moment its storage died.

Only sources write to the ledger; detectors read `snapshot()`; sinks read snapshots and events.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvguardian import _faults
from kvguardian._errors import InternalError, UsageError

_new_tuple = tuple.__new__


class _StorageRef(weakref.ref):  # type: ignore[type-arg]
    """The weak reference to one tracked storage (or watched object), tagged with its entry id: the release
    queue holds these, and an entry whose ``wref`` is no longer this one has moved on (recycled)."""

    __slots__ = ("eid",)
    eid: int

__all__ = [
    "EVENT_KINDS",
    "EntryState",
    "Event",
    "Ledger",
    "LedgerSnapshot",
    "LedgerTotals",
    "Record",
    "RequestInfo",
]


class EntryState(str, enum.Enum):
    """live (owner active) → retained (declared) or orphaned (nothing declared it) → released."""

    LIVE = "live"
    RETAINED = "retained"
    ORPHANED = "orphaned"
    RELEASED = "released"


#: the states of indexed (not yet released) entries
_INDEXED = (EntryState.LIVE, EntryState.RETAINED, EntryState.ORPHANED)


#: Lifecycle event kinds, in the article's words.
EVENT_KINDS = ("init", "append", "hit", "evict", "release", "pressure")  # pressure: the pre-OOM guard's actions


class Event(NamedTuple):
    """One lifecycle event. Never carries KV contents."""

    ts: float  # time.monotonic() when it happened (for release: when the storage was freed)
    kind: str  # one of EVENT_KINDS
    entry_id: int
    request_id: str | None
    tenant: str | None
    layer: int | None
    nbytes: int  # storage bytes of the entry at the time
    detail: str | None = None  # e.g. "superseded", "crop", the hit's previous owner
    # --- additive fields (issue 3): the article's lifecycle fields; None where they do not apply
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


@dataclass(slots=True, eq=False)
class Record:
    """One KV entry. Fields marked write-once are set by the ledger at creation and never change.

    Only the ledger mutates a record; sources go through ledger methods; snapshots hold copies.
    """

    entry_id: int  # write-once: ledger-assigned, never reused
    key: Hashable  # write-once: storage data pointer for tensors; block id / key name for other entries
    kind: str  # write-once: "k", "v", "kv", "block", ...
    layer: int | None  # write-once: model layer index, when known
    request_id: str | None  # owner; changes only on a hit (a later request reuses the entry)
    tenant: str | None  # owner's tenant; changes with request_id
    generation: int  # write-once: model generation when created (a reload bumps it)
    source: str  # write-once: who reported it ("DynamicLayer", "StaticLayer", "track", "pool", ...)
    shape: tuple[int, ...]  # last observed shape of the tensor view ([B, H_kv, S, D] for HF layers; the hot path
    # stores the torch.Size it read, a tuple subclass, and copies make it a plain tuple)
    dtype: str  # write-once
    device: str  # write-once
    logical_bytes: int  # bytes of the last observed view (numel * element size)
    storage_bytes: int  # write-once: bytes of the whole storage, counted once however many views exist
    created: float  # write-once: time.monotonic() at creation
    last_access: float  # time.monotonic() of the last observation
    state: EntryState = EntryState.LIVE
    slot: Hashable | None = None  # logical place (cache id, layer, kind); a newer storage supersedes this one
    superseded: bool = False  # a newer storage took this entry's slot (DynamicLayer's cat every step)
    filled_tokens: int | None = None  # tokens holding data (static caches), None when unknown
    capacity_tokens: int | None = None  # token capacity of the storage (static caches), None when unknown
    grad: bool = False  # requires_grad or grad_fn seen on the tensor
    retained_reason: str | None = None  # set by a declared retention
    released_at: float | None = None  # when the storage was freed
    holder: Any = None  # optional weakref to the owning Python object (cache layer), never a strong ref
    wref: Any = None  # the weakref whose callback reports the storage's release (never a strong ref)
    role: str | None = None  # write-once: "self" / "cross" attention for encoder-decoder caches, else None
    cache: str | None = None  # write-once: label of the cache object the storage belongs to, when known
    incarnation: int = 0  # storages this entry has tracked before the current one (slot recycling), see _recycle
    appends: int = 0  # appends by the current owner; only the first is buffered as an event (see _touch)

    def __repr__(self) -> str:  # id-only: records are compared and logged by id
        return f"<Record #{self.entry_id} {self.kind} layer={self.layer} {self.state.value}>"

    def copy(self) -> Record:
        return Record(
            self.entry_id, self.key, self.kind, self.layer, self.request_id, self.tenant, self.generation,
            self.source, tuple(self.shape), self.dtype, self.device, self.logical_bytes, self.storage_bytes,
            self.created, self.last_access, self.state, self.slot, self.superseded, self.filled_tokens,
            self.capacity_tokens, self.grad, self.retained_reason, self.released_at, None, None,
            self.role, self.cache, self.incarnation,
        )

    @property
    def kv_heads(self) -> int | None:
        return self.shape[1] if len(self.shape) == 4 else None

    @property
    def seq_len(self) -> int | None:
        return self.shape[2] if len(self.shape) == 4 else None

    @property
    def unused_bytes(self) -> int:
        """Bytes of the storage that hold no token: unused static capacity, or the rest of a cropped view."""
        if self.filled_tokens is not None and self.capacity_tokens:
            used = self.storage_bytes * min(self.filled_tokens, self.capacity_tokens) // self.capacity_tokens
            return max(0, self.storage_bytes - used)
        return max(0, self.storage_bytes - self.logical_bytes)


@dataclass(slots=True, eq=False)
class RequestInfo:
    """One request (or an implicit one: a bare generate() call, a manually driven cache)."""

    request_id: str  # write-once
    tenant: str | None  # write-once
    generation: int  # write-once: model generation when the request began
    started: float  # write-once
    ended: float | None = None  # set once by end_request
    implicit: bool = False  # write-once: created by kv-guardian, not by the user
    entry_ids: set[int] = field(default_factory=set)  # live entries it owns

    def __repr__(self) -> str:
        return f"<Request {self.request_id!r} {'ended' if self.ended is not None else 'active'}>"

    @property
    def active(self) -> bool:
        return self.ended is None


@dataclass(frozen=True)
class LedgerSnapshot:
    """An immutable copy of the ledger at one moment: what detectors and sinks read."""

    taken: float
    generation: int
    records: tuple[Record, ...]  # live, retained and orphaned entries (released ones are gone)
    requests: dict[str, RequestInfo]
    retained_series: tuple[tuple[float, str, int], ...]  # (time, request id, ended-owner bytes) per request end
    grad_observations: tuple[dict[str, Any], ...]
    event_counts: dict[str, int]
    events_dropped: int
    instrumentation_errors: dict[str, int]
    released_entries: int
    released_bytes: int

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
        """KV bytes whose owner has ended / all KV bytes (DESIGN.md). 0.0 when nothing is tracked."""
        total = self.total_bytes()
        if total == 0:
            return 0.0
        ended = sum(r.storage_bytes for r in self.records if r.state is not EntryState.LIVE)
        return ended / total

    def fragmentation_ratio(self) -> float:
        """KV bytes allocated but holding no token / KV bytes allocated (DESIGN.md)."""
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


class LedgerTotals(NamedTuple):
    """Aggregates of the ledger at one moment, computed in one pass without copying records (for scrapes).

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


class Ledger:
    """One record per KV entry, lifecycle events in a bounded buffer, and no strong reference to any tensor.

    Args:
        event_capacity: events kept before the oldest are dropped (and counted as dropped).
        request_history: ended requests remembered after their last entry was released.
        series_capacity: request-end samples kept for the growth trend test.
        clock: monotonic clock, injectable for tests.
    """

    def __init__(
        self,
        *,
        event_capacity: int = 65_536,
        request_history: int = 4_096,
        series_capacity: int = 4_096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if event_capacity < 1 or request_history < 1 or series_capacity < 1:
            raise UsageError("Ledger capacities must be >= 1; fix: pass positive event_capacity/request_history")
        self._lock = threading.RLock()
        self._clock = clock
        self._next_id = 1
        self.generation = 0
        self._by_key: dict[Hashable, Record] = {}  # live (not released) entries by storage pointer / key
        self._by_id: dict[int, Record] = {}
        self._slots: dict[Hashable, Record] = {}  # slot -> the entry currently filling it
        self._vacated: dict[Hashable, tuple[Record, float, str | None]] = {}  # freed, not yet replaced
        self._vacated_limit = 4_096
        self._freed: deque[tuple[_StorageRef, float]] = deque()  # (weak ref whose referent died, time of death)
        self._requests: OrderedDict[str, RequestInfo] = OrderedDict()
        self._request_history = request_history
        self._events: deque[Event] = deque(maxlen=event_capacity)
        self._event_counts: Counter[str] = Counter()
        self.events_dropped = 0
        self._series: deque[tuple[float, str, int]] = deque(maxlen=series_capacity)
        self._ended_bytes = 0  # bytes of non-released entries whose owner has ended
        # totals() in O(1) plus the entries that may have unused bytes, whatever the ledger's size (a scrape
        # reads them): bytes and entries by state, kept where an entry is indexed, changes state or storage, or
        # is released; check_invariants() recomputes them
        self._state_bytes: dict[EntryState, int] = dict.fromkeys(_INDEXED, 0)
        self._state_n: dict[EntryState, int] = dict.fromkeys(_INDEXED, 0)
        # entries that had capacity or a view smaller than their storage when last observed: every other
        # entry's unused bytes are 0 (fragmentation, see Record.unused_bytes)
        self._partial: dict[int, Record] = {}
        self._grad_obs: deque[dict[str, Any]] = deque(maxlen=256)
        self.instrumentation_errors: Counter[str] = Counter()
        self.released_entries = 0
        self.released_bytes = 0
        freed_append = self._freed.append
        clock = self._clock

        def on_freed(wref: _StorageRef) -> None:
            # Runs inside a storage's deallocation, possibly in another thread or inside a ledger call: it only
            # appends (atomic under the GIL; nothing here can raise but MemoryError); _drain applies it.
            freed_append((wref, clock()))

        self._on_freed_cb = on_freed  # the callback of every weak reference
        self._appends = 0  # coalesced appends not yet added to _event_counts (folded in by _settle)
        self._batch = 0  # > 0 inside observe_batch(): releases wait for its end (see there)
        self._names: dict[Any, str] = {}  # torch dtype/device -> its name (str() is slow on the hot path)
        self._event_cap = event_capacity
        self._on_release_error: Callable[[str, BaseException], None] | None = None

    # ------------------------------------------------------------------ requests
    def begin_request(self, request_id: str, tenant: str | None = None, *, implicit: bool = False) -> RequestInfo:
        """Start a request. Raises `UsageError` if a request with this id is still active."""
        with self._lock:
            self._settle()
            old = self._requests.get(request_id)
            if old is not None and old.active:
                raise UsageError(
                    f"request {request_id!r} is already active; fix: use a unique id per request "
                    "or end the first one before starting another"
                )
            info = RequestInfo(request_id, tenant, self.generation, self._clock(), implicit=implicit)
            self._requests[request_id] = info
            self._requests.move_to_end(request_id)
            return info

    def end_request(self, request_id: str) -> RequestInfo:
        """End a request: its live entries become retained (declared) or orphaned; sample ended bytes."""
        with self._lock:
            self._settle()
            info = self._requests.get(request_id)
            if info is None or not info.active:
                raise UsageError(f"request {request_id!r} is not active; fix: end each request exactly once")
            now = self._clock()
            info.ended = now
            for eid in list(info.entry_ids):
                rec = self._by_id.get(eid)
                if rec is None:
                    info.entry_ids.discard(eid)
                    continue
                self._end_owner(rec)
            self._series.append((now, request_id, self._ended_bytes))
            self._prune_requests()
            return info

    def request(self, request_id: str) -> RequestInfo | None:
        return self._requests.get(request_id)

    def active_requests(self) -> list[RequestInfo]:
        with self._lock:
            return [r for r in self._requests.values() if r.active]

    def bump_generation(self) -> int:
        """A model reload: entries created from now on belong to the next generation."""
        with self._lock:
            self.generation += 1
            return self.generation

    # ------------------------------------------------------------------ entries
    def observe_tensor(
        self,
        tensor: Any,
        *,
        kind: str,
        layer: int | None,
        request: RequestInfo | None,
        source: str,
        slot: Hashable | None = None,
        filled_tokens: int | None = None,
        capacity_tokens: int | None = None,
        holder: Any = None,
        role: str | None = None,
        cache: str | None = None,
    ) -> Record | None:
        """Record that ``tensor`` (a KV tensor or a view of one) is in use by ``request``.

        Returns the entry, or None for an empty tensor (no storage to track).
        """
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0:
            return None
        with self._lock:
            rec = self._observe(tensor, storage, ptr, kind, layer, request, source, slot, filled_tokens,
                                capacity_tokens, holder, role, cache, self._clock())
            if self._freed and not self._batch:
                self._drain()
            return rec

    def observe_pair(
        self,
        keys: Any,
        values: Any,
        *,
        layer: int | None,
        request: RequestInfo | None,
        source: str,
        slots: tuple[Hashable, Hashable] | None = None,
        filled_tokens: int | None = None,
        capacity_tokens: int | None = None,
        role: str | None = None,
        cache: str | None = None,
    ) -> tuple[Record | None, Record | None]:
        """`observe_tensor` for one layer's keys and values (kinds "k" and "v") under one lock. ``values`` may
        be None."""
        ks = keys.untyped_storage()
        kp = ks.data_ptr()
        if values is not None:
            vs = values.untyped_storage()
            vp = vs.data_ptr()
        else:
            vp = 0
        sk, sv = slots if slots is not None else (None, None)
        with self._lock:
            now = self._clock()
            rk = rv = None
            if kp:
                rk = self._observe(keys, ks, kp, "k", layer, request, source, sk, filled_tokens, capacity_tokens,
                                   None, role, cache, now)
            if vp:
                rv = self._observe(values, vs, vp, "v", layer, request, source, sv, filled_tokens,
                                   capacity_tokens, None, role, cache, now)
            if self._freed and not self._batch:
                self._drain()
            return rk, rv

    def observe_kv(
        self, keys: Any, values: Any, layer: int | None, request: RequestInfo | None, source: str,
        slots: tuple[Hashable, Hashable], filled_tokens: int | None, capacity_tokens: int | None,
        role: str | None, cache: str | None, check_grad: bool = True,
    ) -> bool:
        """`observe_pair` with positional arguments: the per-layer, per-decode-step hot path of cache
        instrumentation. Returns whether either entry has seen a tensor that requires grad.

        ``check_grad=False`` says grad mode is off for this update (``torch.is_grad_enabled()``), so no tensor
        it produced requires grad: ``requires_grad`` is then read only where an entry is created.
        """
        ks = keys.untyped_storage()
        kp = ks.data_ptr()
        if values is not None:
            vs = values.untyped_storage()
            vp = vs.data_ptr()
        else:
            vs = None
            vp = 0
        grad = False
        lock = self._lock
        lock.acquire()  # not `with`: the context-manager protocol costs as much as the rest of a fast path
        try:
            now = self._clock()
            # releases are applied after, not before: a slot whose storage was just freed (DynamicLayer's cat)
            # then continues with the new storage (_recycle) instead of a release plus a new record
            if kp:
                grad = self._observe(keys, ks, kp, "k", layer, request, source, slots[0], filled_tokens,
                                     capacity_tokens, None, role, cache, now, check_grad).grad
            if vp:
                grad = self._observe(values, vs, vp, "v", layer, request, source, slots[1], filled_tokens,
                                     capacity_tokens, None, role, cache, now, check_grad).grad or grad
            if self._freed and not self._batch:
                self._drain()
        finally:
            lock.release()
        return grad

    @contextlib.contextmanager
    def observe_batch(self) -> Iterator[None]:
        """Observe several slots' updates (one forward's layers) before applying the releases that happened
        meanwhile. A forward replaces every layer's storage before its updates are observed; applying the
        old storages' releases at the first observation would close the other layers' entries and open new
        ones, where observing first lets each entry continue with its new storage (`_continue`)."""
        with self._lock:
            self._batch += 1
        try:
            yield
        finally:
            with self._lock:
                self._batch -= 1
                if not self._batch and self._freed:
                    self._drain()

    def _continue(self, tensor: Any, storage: Any, ptr: int, slot: Hashable, request: RequestInfo | None,
                  filled_tokens: int | None, check_grad: bool, now: float) -> Record | None:
        """The fast path of a slot's next observation (lock held): the slot's entry goes on with this tensor,
        or None when it cannot (no entry yet, a storage already tracked elsewhere, or the slot's previous
        storage still alive - a new entry supersedes it) and `_observe` decides."""
        rec = self._slots.get(slot)
        if rec is None:
            return None
        wref = rec.wref
        if wref is None:
            return None
        if rec.key == ptr and wref() is not None:
            # the same storage (written in place, as static caches do, or a new view of it)
            rec.last_access = now
            rec.shape = tensor.shape  # a torch.Size (a tuple); copies convert it
            nb = rec.logical_bytes = tensor.nbytes
            if nb < rec.storage_bytes:
                self._partial[rec.entry_id] = rec
            if filled_tokens is not None:
                rec.filled_tokens = filled_tokens
            if check_grad and tensor.requires_grad:
                rec.grad = True
        elif wref() is None:
            other = self._by_key.get(ptr)
            if other is not None and other is not rec:
                return None
            self._recycle(rec, tensor, storage, ptr, check_grad, now)
        else:
            return None
        if request is None or rec.request_id == request.request_id:
            if rec.appends:  # coalesced: counted, not buffered (see _touch)
                rec.appends += 1
                self._appends += 1
            else:
                rec.appends = 1
                self._emit(now, "append", rec, None)
        else:
            self._touch(rec, request, now)
        return rec

    def _observe(
        self, tensor: Any, storage: Any, ptr: int, kind: str, layer: int | None, request: RequestInfo | None,
        source: str, slot: Hashable | None, filled_tokens: int | None, capacity_tokens: int | None, holder: Any,
        role: str | None, cache: str | None, now: float, check_grad: bool = True,
    ) -> Record:
        """Record one observation of ``tensor`` (lock held): a slot's entry continues in place when it can
        (`_continue`, the per-step fast path); otherwise the storage's entry is found, recycled or created."""
        if slot is not None:
            rec = self._continue(tensor, storage, ptr, slot, request, filled_tokens, check_grad, now)
            if rec is not None:
                return rec
        rec = self._by_key.get(ptr)
        if rec is not None and rec.wref is not None and rec.wref() is None:
            # the entry's storage was freed and this new storage got its address (release not applied yet)
            if slot is not None and rec.slot == slot:
                self._recycle(rec, tensor, storage, ptr, True, now)
                self._touch(rec, request, now)
                return rec
            self._drain()
            rec = self._by_key.get(ptr)
        if rec is not None:
            rec.last_access = now
            rec.shape = tuple(tensor.shape)
            nb = rec.logical_bytes = tensor.nbytes
            if nb < rec.storage_bytes:
                self._partial[rec.entry_id] = rec
            if filled_tokens is not None:
                rec.filled_tokens = filled_tokens
            if tensor.requires_grad:
                rec.grad = True
            self._touch(rec, request, now)
            return rec
        if slot is not None:
            prev = self._slots.get(slot)
            if prev is not None and prev.wref is not None and prev.wref() is None:
                # DynamicLayer's torch.cat: the slot's previous storage has just been freed and this one takes
                # its place. The entry continues with the new storage (see _recycle): no new record.
                self._recycle(prev, tensor, storage, ptr, True, now)
                self._touch(prev, request, now)
                return prev
        eid = self._next_id
        self._next_id += 1
        names = self._names
        dtype = tensor.dtype
        dname = names.get(dtype)
        if dname is None:
            dname = names[dtype] = str(dtype)
        device = tensor.device
        devname = names.get(device)
        if devname is None:
            devname = names[device] = str(device)
        rec = Record(
            eid, ptr, kind, layer,
            request.request_id if request is not None else None,
            request.tenant if request is not None else None,
            self.generation, source, tuple(tensor.shape), dname, devname,
            tensor.nbytes, storage.nbytes(), now, now,
            EntryState.LIVE, slot, False, filled_tokens, capacity_tokens,
            bool(tensor.requires_grad), None, None, holder, None, role, cache,
        )
        wref = rec.wref = _StorageRef(storage, self._on_freed_cb)
        wref.eid = eid
        self._insert(rec, request, now)
        return rec

    def _recycle(self, rec: Record, tensor: Any, storage: Any, ptr: int, check_grad: bool, now: float) -> None:
        """The entry of a slot whose storage was freed continues with the storage that replaced it.

        Equivalent to releasing the old storage and recording the new one in the same slot - the same
        counters (released entries and bytes), the same "append" (or "hit") event, which the caller records -
        without creating and dropping a record every decode step. The old storage's queued release is skipped
        because the entry's ``wref`` is no longer the one queued.
        """
        old_bytes = rec.storage_bytes
        self.released_entries += 1
        self.released_bytes += old_bytes
        by_key = self._by_key
        old = by_key.pop(rec.key, None)
        if old is not None and old is not rec:  # the old address already belongs to another entry
            by_key[rec.key] = old
        by_key[ptr] = rec
        rec.key = ptr
        rec.incarnation += 1
        wref = rec.wref = _StorageRef(storage, self._on_freed_cb)
        wref.eid = rec.entry_id
        new_bytes = storage.nbytes()
        if rec.state is not EntryState.LIVE and rec.request_id is not None:
            info = self._requests.get(rec.request_id)
            if info is not None and info.ended is not None:
                self._ended_bytes += new_bytes - old_bytes
        rec.storage_bytes = new_bytes
        self._state_bytes[rec.state] += new_bytes - old_bytes
        rec.shape = tensor.shape  # a torch.Size (a tuple); copies convert it
        nb = rec.logical_bytes = tensor.nbytes
        if nb < new_bytes:
            self._partial[rec.entry_id] = rec
        rec.last_access = now
        rec.superseded = False
        rec.grad = check_grad and tensor.requires_grad

    def add_entry(
        self,
        key: Hashable,
        *,
        kind: str,
        nbytes: int,
        request: RequestInfo | None,
        source: str,
        layer: int | None = None,
        shape: tuple[int, ...] = (),
        dtype: str = "",
        device: str = "",
        slot: Hashable | None = None,
        filled_tokens: int | None = None,
        capacity_tokens: int | None = None,
        watch: Any = None,
    ) -> Record:
        """Record a non-tensor entry (a pool block, a key). Release it with `release_entry`, or pass
        ``watch`` (a weak-referenceable object) to release it when that object dies."""
        with self._lock:
            self._drain()
            if key in self._by_key:
                raise UsageError(f"entry key {key!r} is already live; fix: release it before adding it again")
            now = self._clock()
            eid = self._next_id
            self._next_id += 1
            rec = Record(
                eid, key, kind, layer,
                request.request_id if request is not None else None,
                request.tenant if request is not None else None,
                self.generation, source, shape, dtype, device, nbytes, nbytes, now, now,
                slot=slot, filled_tokens=filled_tokens, capacity_tokens=capacity_tokens,
            )
            if watch is not None:
                wref = rec.wref = _StorageRef(watch, self._on_freed_cb)
                wref.eid = eid
            self._insert(rec, request, now)
            return rec

    def touch_entry(self, key: Hashable, request: RequestInfo | None, *, filled_tokens: int | None = None) -> None:
        """A non-tensor entry was used (appended to, read) by ``request``."""
        with self._lock:
            self._drain()
            rec = self._by_key.get(key)
            if rec is None:
                raise UsageError(f"no live entry with key {key!r}; fix: add_entry() it first")
            now = self._clock()
            rec.last_access = now
            if filled_tokens is not None:
                rec.filled_tokens = filled_tokens
            self._touch(rec, request, now)

    def release_entry(self, key: Hashable, *, detail: str | None = None) -> None:
        """A non-tensor entry was released by its source (a freed block, an expired key)."""
        with self._lock:
            self._drain()
            rec = self._by_key.get(key)
            if rec is None:
                raise UsageError(f"no live entry with key {key!r}; fix: release each entry once")
            self._release(rec, self._clock(), detail)

    def evict(self, rec: Record, *, detail: str | None = None) -> None:
        """A source dropped an entry from its cache on purpose (reset, crop, LRU eviction)."""
        with self._lock:
            self._emit(self._clock(), "evict", rec, detail)

    def retain_keys(self, keys: Iterable[Hashable], reason: str) -> int:
        """Declare entries legitimately retained. Returns how many live entries were marked."""
        if not reason:
            raise UsageError("a retention needs a reason; fix: guard.retain(obj, reason='system prompt cache')")
        n = 0
        with self._lock:
            self._drain()
            for key in keys:
                rec = self._by_key.get(key)
                if rec is None:
                    continue
                rec.retained_reason = reason
                if rec.state is EntryState.ORPHANED:
                    self._move(rec, EntryState.RETAINED)
                n += 1
        return n

    def clear_retention(self, keys: Iterable[Hashable] | None = None) -> None:
        """Undo declared retention (all of it, or for ``keys``); ended entries become orphaned again."""
        with self._lock:
            self._drain()
            recs = self._by_key.values() if keys is None else [self._by_key[k] for k in keys if k in self._by_key]
            for rec in recs:
                rec.retained_reason = None
                if rec.state is EntryState.RETAINED:
                    self._move(rec, EntryState.ORPHANED)

    def note_grad(self, observation: dict[str, Any]) -> None:
        """Keep the evidence of a grad-tracked KV observation (bounded)."""
        with self._lock:
            self._grad_obs.append(observation)

    def note_error(self, site: str) -> int:
        """Count an instrumentation error at ``site``; returns the count so far for that site."""
        self.instrumentation_errors[site] += 1
        return self.instrumentation_errors[site]

    def record_for_key(self, key: Hashable) -> Record | None:
        return self._by_key.get(key)

    def live_keys(self) -> set[Hashable]:
        with self._lock:
            self._settle()
            return set(self._by_key)

    # ------------------------------------------------------------------ reading
    def snapshot(self) -> LedgerSnapshot:
        with self._lock:
            self._settle()
            return LedgerSnapshot(
                taken=self._clock(),
                generation=self.generation,
                records=tuple(r.copy() for r in self._by_id.values()),
                requests={
                    k: RequestInfo(v.request_id, v.tenant, v.generation, v.started, v.ended, v.implicit,
                                   set(v.entry_ids))
                    for k, v in self._requests.items()
                },
                retained_series=tuple(self._series),
                grad_observations=tuple(
                    {**o, "layers": list(o.get("layers", ())), "layer_updates": dict(o.get("layer_updates", {}))}
                    for o in self._grad_obs
                ),
                event_counts={
                    **{k: self._event_counts.get(k, 0) for k in EVENT_KINDS},
                    **{f"cache_{k}": self._event_counts.get(f"cache_{k}", 0) for k in EVENT_KINDS},
                },
                events_dropped=self.events_dropped,
                instrumentation_errors=dict(self.instrumentation_errors),
                released_entries=self.released_entries,
                released_bytes=self.released_bytes,
            )

    def totals(self) -> LedgerTotals:
        """Bytes and entries by state, the two ratios and the counters, without a pass over the entries: the
        totals by state are kept as entries change, and only entries that may have unused bytes (a capacity,
        or a view smaller than its storage) are visited for the fragmentation ratio."""
        live, retained, orphaned = EntryState.LIVE, EntryState.RETAINED, EntryState.ORPHANED
        with self._lock:
            self._settle()
            sb, sn = self._state_bytes, self._state_n
            b_live, b_ret, b_orph = sb[live], sb[retained], sb[orphaned]
            total = b_live + b_ret + b_orph
            return LedgerTotals(
                bytes_by_state={"live": b_live, "retained": b_ret, "orphaned": b_orph},
                entries_by_state={"live": sn[live], "retained": sn[retained], "orphaned": sn[orphaned]},
                residency_ratio=(b_ret + b_orph) / total if total else 0.0,
                fragmentation_ratio=self._unused(self._partial.values()) / total if total else 0.0,
                requests_active=sum(1 for r in self._requests.values() if r.active),
                generation=self.generation,
                event_counts={k: self._event_counts.get(k, 0) for k in EVENT_KINDS},
                events_dropped=self.events_dropped,
                instrumentation_errors=dict(self.instrumentation_errors),
                released_entries=self.released_entries,
                released_bytes=self.released_bytes,
            )

    @staticmethod
    def _unused(records: Iterable[Record]) -> int:
        """Sum of `Record.unused_bytes` (inlined: this runs on every scrape)."""
        unused = 0
        for rec in records:
            size = rec.storage_bytes
            filled = rec.filled_tokens
            if filled is not None and rec.capacity_tokens:
                cap = rec.capacity_tokens
                used = size * (filled if filled < cap else cap) // cap
                if size > used:
                    unused += size - used
            elif size > rec.logical_bytes:
                unused += size - rec.logical_bytes
        return unused

    def events(self) -> list[Event]:
        """A copy of the buffered events, oldest first."""
        with self._lock:
            self._settle()
            return list(self._events)

    def take_events(self) -> list[Event]:
        """Pop every buffered event (swap the buffer), so a consumer never keeps them twice."""
        with self._lock:
            self._settle()
            out = list(self._events)
            self._events.clear()
            return out

    def __len__(self) -> int:
        with self._lock:
            self._settle()
            return len(self._by_id)

    def check_invariants(self) -> None:
        """Raise `InternalError` if the ledger's indexes disagree (tests and the auditor call this)."""
        with self._lock:
            self._settle()
            if set(self._by_id) != {r.entry_id for r in self._by_key.values()}:
                raise InternalError("ledger bug: _by_id and _by_key disagree")
            ended = 0
            for rec in self._by_id.values():
                if rec.state is EntryState.RELEASED:
                    raise InternalError(f"ledger bug: released {rec!r} still indexed")
                if rec.request_id is not None:
                    info = self._requests.get(rec.request_id)
                    if info is None or rec.entry_id not in info.entry_ids:
                        raise InternalError(f"ledger bug: {rec!r} owner {rec.request_id!r} does not list it")
                    if not info.active:
                        ended += rec.storage_bytes
                        if rec.state is EntryState.LIVE:
                            raise InternalError(f"ledger bug: {rec!r} is live but its owner ended")
            if ended != self._ended_bytes:
                raise InternalError(f"ledger bug: ended bytes {self._ended_bytes} != recomputed {ended}")
            by_bytes = dict.fromkeys(_INDEXED, 0)
            by_n = dict.fromkeys(_INDEXED, 0)
            for rec in self._by_id.values():
                by_bytes[rec.state] += rec.storage_bytes
                by_n[rec.state] += 1
            if by_bytes != self._state_bytes or by_n != self._state_n:
                raise InternalError(f"ledger bug: totals by state {self._state_bytes} {self._state_n} != "
                                    f"recomputed {by_bytes} {by_n}")
            if any(self._by_id.get(eid) is not rec for eid, rec in self._partial.items()):
                raise InternalError("ledger bug: a released entry is still in _partial")
            if self._unused(self._by_id.values()) != self._unused(self._partial.values()):
                raise InternalError("ledger bug: an entry with unused bytes is missing from _partial")

    # ------------------------------------------------------------------ internals (lock held)
    def _insert(self, rec: Record, request: RequestInfo | None, now: float) -> None:
        self._by_key[rec.key] = rec
        self._by_id[rec.entry_id] = rec
        self._state_bytes[rec.state] += rec.storage_bytes
        self._state_n[rec.state] += 1
        if rec.capacity_tokens or rec.logical_bytes < rec.storage_bytes:
            self._partial[rec.entry_id] = rec
        if request is not None:
            request.entry_ids.add(rec.entry_id)
            if request.ended is not None:  # an entry created for an ended request (late hook): ended at birth
                self._end_owner(rec)
        if rec.slot is None:
            self._emit(now, "init", rec, None)
            return
        prev = self._slots.get(rec.slot)
        self._slots[rec.slot] = rec
        if prev is None and self._vacated.pop(rec.slot, None) is not None:
            # the slot's previous storage was freed just before this one arrived: growth by replacement
            self._emit(now, "append", rec, None)
        elif prev is not None and prev is not rec:
            prev.superseded = True  # still alive: something besides the cache holds the old storage
            self._emit(now, "append", rec, None)
        else:
            self._emit(now, "init", rec, None)

    def _flush_vacated(self) -> None:
        """Slots whose storage was freed and not replaced since: the cache let go of them (release)."""
        while self._vacated:
            _, (rec, ts, detail) = self._vacated.popitem()
            self._emit(ts, "release", rec, detail)

    def _touch(self, rec: Record, request: RequestInfo | None, now: float) -> None:
        if request is None or rec.request_id == request.request_id:
            # Appends are coalesced per entry and owner: the first one is an event in the buffer, the rest
            # (one per layer and decode step) are counted in event_counts["append"] and on the record. A
            # buffer of per-step events would cost more than the rest of the hook and evict everything else.
            if rec.appends:
                rec.appends += 1
                self._appends += 1
            else:
                rec.appends = 1
                self._emit(now, "append", rec, None)
            return
        # a hit: a later request reuses this entry; ownership moves to it
        previous = rec.request_id
        old = self._requests.get(previous) if previous is not None else None
        if old is not None:
            old.entry_ids.discard(rec.entry_id)
            if old.ended is not None:
                self._ended_bytes -= rec.storage_bytes
        rec.request_id = request.request_id
        rec.tenant = request.tenant
        self._move(rec, EntryState.LIVE)
        rec.appends = 0
        request.entry_ids.add(rec.entry_id)
        if request.ended is not None:
            self._end_owner(rec)
        self._emit(now, "hit", rec, previous)

    def _end_owner(self, rec: Record) -> None:
        self._move(rec, EntryState.RETAINED if rec.retained_reason else EntryState.ORPHANED)
        self._ended_bytes += rec.storage_bytes

    def _move(self, rec: Record, state: EntryState) -> None:
        """Change an indexed entry's state, and the totals by state with it."""
        old = rec.state
        if old is not state:
            size = rec.storage_bytes
            self._state_bytes[old] -= size
            self._state_bytes[state] += size
            self._state_n[old] -= 1
            self._state_n[state] += 1
            rec.state = state

    def _settle(self) -> None:
        """Apply pending releases and decide vacated slots (used by reads and request boundaries)."""
        self._drain()
        self._flush_vacated()
        if self._appends:
            self._event_counts["append"] += self._appends
            self._appends = 0

    def _drain(self) -> None:
        """Apply the releases queued by weak-reference callbacks (lock held)."""
        freed = self._freed
        if not freed:
            return
        by_id = self._by_id
        while freed:
            wref, ts = freed.popleft()
            rec = by_id.get(wref.eid)
            if rec is None or rec.wref is not wref:
                continue  # a storage the entry no longer tracks (recycled) or an entry already released
            if _faults.FAULTS:
                try:
                    _faults.maybe_fail("release")
                except Exception as exc:  # fail open: the release is not applied (counted by the handler)
                    handler = self._on_release_error
                    if handler is not None:
                        handler("release", exc)
                    continue
            self._release(rec, ts, "superseded" if rec.superseded else None)

    def _release(self, rec: Record, ts: float, detail: str | None) -> None:
        del self._by_id[rec.entry_id]
        self._state_bytes[rec.state] -= rec.storage_bytes
        self._state_n[rec.state] -= 1
        self._partial.pop(rec.entry_id, None)
        if self._by_key.get(rec.key) is rec:
            del self._by_key[rec.key]
        if rec.request_id is not None:
            info = self._requests.get(rec.request_id)
            if info is not None:
                if rec.state is not EntryState.LIVE and info.ended is not None:
                    self._ended_bytes -= rec.storage_bytes
                info.entry_ids.discard(rec.entry_id)
        rec.state = EntryState.RELEASED
        rec.released_at = ts
        self.released_entries += 1
        self.released_bytes += rec.storage_bytes
        if rec.slot is not None and self._slots.get(rec.slot) is rec:
            # Wait: if a new storage fills this slot before the ledger is read, this was a replacement
            # (DynamicLayer's cat), not a release. _flush_vacated emits the release otherwise.
            del self._slots[rec.slot]
            self._vacated[rec.slot] = (rec, ts, detail)
            if len(self._vacated) > self._vacated_limit:
                self._flush_vacated()
        elif not rec.superseded:
            self._emit(ts, "release", rec, detail)
        if len(self._requests) > self._request_history:
            self._prune_requests()

    def _emit(self, ts: float, kind: str, rec: Record, detail: str | None) -> None:
        events = self._events
        if len(events) == self._event_cap:
            self.events_dropped += 1
        shape: tuple[int, ...] | None = None
        dtype: str | None = None
        device: str | None = None
        if kind == "init":
            shape, dtype, device = tuple(rec.shape), rec.dtype, rec.device
        # tuple.__new__ directly: Event's generated __new__ with 16 fields costs more on the hot path
        events.append(_new_tuple(Event, (
            ts, kind, rec.entry_id, rec.request_id, rec.tenant, rec.layer, rec.storage_bytes, detail,
            "entry", rec.cache, shape, dtype, device, None, None, None,
        )))
        self._event_counts[kind] += 1

    def emit_cache_event(
        self,
        kind: str,
        *,
        cache: str,
        request: RequestInfo | None,
        nbytes: int = 0,
        layer: int | None = None,
        detail: str | None = None,
        shape: tuple[int, ...] | None = None,
        dtype: str | None = None,
        device: str | None = None,
        hit_ratio: float | None = None,
        latency_delta: float | None = None,
        first_token_s: float | None = None,
        ts: float | None = None,
    ) -> None:
        """A lifecycle event about a whole cache object (scope "cache"), reported by a source: init on its
        first prefill, hit when a later request reuses it, evict on crop/reset, release when it is freed."""
        if kind not in EVENT_KINDS:
            raise UsageError(f"unknown event kind {kind!r}; use one of {', '.join(EVENT_KINDS)}")
        with self._lock:
            if len(self._events) == self._event_cap:
                self.events_dropped += 1
            self._events.append(Event(
                self._clock() if ts is None else ts, kind, 0,
                request.request_id if request is not None else None,
                request.tenant if request is not None else None,
                layer, nbytes, detail, "cache", cache, shape, dtype, device, hit_ratio, latency_delta,
                first_token_s,
            ))
            self._event_counts[f"cache_{kind}"] += 1

    def _prune_requests(self) -> None:
        # Forget the oldest ended requests with no entries once over the history bound.
        excess = len(self._requests) - self._request_history
        if excess <= 0:
            return
        for rid in list(self._requests):
            if excess <= 0:
                break
            info = self._requests[rid]
            if not info.active and not info.entry_ids:
                del self._requests[rid]
                excess -= 1
