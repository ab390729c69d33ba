"""The ledger's bounded KV timeline: bytes by state over time, sampled at request ends and on a fixed interval,
and each request's span - in buffers whose size never grows.

When the sample buffer is full, neighbouring samples merge (peaks kept) and the stride doubles, so a week-long
server keeps a week at coarser resolution; request lanes are bounded too. The ledger feeds it totals it already
keeps (O(1)) and has no thread: the next ledger call takes a due sample. `timeline_json` is the report's
``summary["timeline"]``. Details: docs/design/ledger.md.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvguardian.core.errors import UsageError
from kvguardian.core.ledger.records import EntryState

if TYPE_CHECKING:
    from kvguardian.core.ledger.events import Event
    from kvguardian.core.ledger.totals import StateTotals

__all__ = ["Lane", "Timeline", "timeline_json"]

VERSION = 1
_EVENTS = 10_000  # lifecycle events in a report (the newest)
_ENTRIES = 10_000  # alive entries in a report


@dataclass(slots=True, eq=False)
class Lane:
    """One request's span. Mutated only by `Timeline`."""

    request_id: str
    tenant: str | None
    start: float  # seconds since the origin
    end: float | None = None
    bytes: int = 0  # KV bytes the request owned when it ended
    freed: float | None = None  # when its last KV was released after it ended


class Timeline:
    """Bounded samples and lanes (the caller locks).

    Args:
        origin: the clock's value at t = 0.
        capacity: samples kept (>= 8).
        interval_s: seconds between interval samples at stride 1.
        lanes: request lanes kept.
    """

    def __init__(self, origin: float, *, capacity: int = 2048, interval_s: float = 1.0, lanes: int = 4096) -> None:
        if capacity < 8 or lanes < 1 or not interval_s > 0:
            raise UsageError(f"timeline capacity {capacity} (>= 8), lanes {lanes} (>= 1) and interval {interval_s} s "
                             "(> 0) are out of range")
        self.origin = origin
        self.origin_unix = time.time()
        self.capacity = capacity
        self.interval_s = interval_s
        self.stride = 1
        self.samples: list[list[float]] = []
        self.next_due = origin  # clock value of the next interval sample (the first is due at once)
        self.lanes: OrderedDict[str, Lane] = OrderedDict()
        self.lane_capacity = lanes
        self.lanes_dropped = 0
        self.requests_seen = 0

    # ------------------------------------------------------------------ samples
    def due(self, now: float) -> bool:
        """Whether an interval sample is due (one comparison: callers test it on paths that run often)."""
        return now >= self.next_due

    def take(self, now: float, totals: StateTotals, *, request_end: bool = False) -> None:
        """A sample of the ledger's running totals (O(1): they are kept as entries change)."""
        by_state = totals.bytes
        self.sample(now, (by_state[EntryState.LIVE], by_state[EntryState.RETAINED], by_state[EntryState.ORPHANED],
                          totals.released_bytes), request_end=request_end)

    def tick(self, now: float, totals: StateTotals) -> None:
        """The interval sample, when due (one float comparison when it is not)."""
        if now >= self.next_due:
            self.take(now, totals)

    def sample(self, now: float, by_state: tuple[int, int, int, int], *, request_end: bool = False) -> None:
        """Record the bytes ``(live, retained, orphaned, released so far)`` at ``now``. A request end close to the
        last sample folds into it."""
        row = [now - self.origin, *map(float, by_state)]
        t = row[0]
        samples = self.samples
        if samples and samples[-1] == row:  # the same instant twice (a report right after a sample)
            return
        fold = 0.0 if self.stride == 1 else self.interval_s * self.stride / 4
        if request_end and samples and t - samples[-1][0] < fold:
            last = samples[-1]
            if row[1] + row[2] + row[3] >= last[1] + last[2] + last[3]:
                samples[-1] = row
            else:
                last[4] = row[4]
        else:
            samples.append(row)
            if len(samples) >= self.capacity:
                self._halve()
        if not request_end or now >= self.next_due:
            self.next_due = now + self.interval_s * self.stride

    def _halve(self) -> None:
        rows = self.samples
        merged = []
        for i in range(0, len(rows) - 1, 2):
            a, b = rows[i], rows[i + 1]
            keep = list(a if a[1] + a[2] + a[3] > b[1] + b[2] + b[3] else b)
            keep[4] = max(a[4], b[4])  # released so far: the later (it only grows)
            merged.append(keep)
        if len(rows) % 2:
            merged.append(rows[-1])
        self.samples = merged
        self.stride *= 2

    # ------------------------------------------------------------------ lanes
    def begin(self, request_id: str, tenant: str | None, now: float) -> None:
        self.requests_seen += 1
        lanes = self.lanes
        lanes.pop(request_id, None)  # an id used again starts a new lane
        lanes[request_id] = Lane(request_id, tenant, now - self.origin)
        if len(lanes) > self.lane_capacity:
            for rid, lane in lanes.items():
                if lane.end is not None:
                    del lanes[rid]
                    break
            else:  # every lane is active: forget the oldest
                lanes.popitem(last=False)
            self.lanes_dropped += 1

    def end(self, request_id: str, now: float, owned_bytes: int) -> None:
        lane = self.lanes.get(request_id)
        if lane is not None:
            lane.end = now - self.origin
            lane.bytes = owned_bytes
            if owned_bytes == 0:
                lane.freed = lane.end

    def freed(self, request_id: str, now: float) -> None:
        """The last KV of ended request ``request_id`` was released at ``now``."""
        lane = self.lanes.get(request_id)
        if lane is not None and lane.end is not None:
            lane.freed = now - self.origin

    def check(self) -> None:
        """Raise `InternalError` when a buffer exceeds its bound or samples go back in time."""
        from kvguardian.core.errors import InternalError

        if len(self.samples) >= self.capacity or len(self.lanes) > self.lane_capacity:
            raise InternalError(f"timeline bug: {len(self.samples)} samples (capacity {self.capacity}), "
                                f"{len(self.lanes)} lanes (capacity {self.lane_capacity})")
        ts = [s[0] for s in self.samples]
        if ts != sorted(ts):
            raise InternalError("timeline bug: samples are not in time order")


def _after_end(records: Iterable[Any]) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """Per request: bytes alive after its end by layer, and the worst state (orphaned over retained)."""
    after: dict[str, dict[str, int]] = {}
    state: dict[str, str] = {}
    for r in records:
        s = r.state.value
        if s in ("live", "released") or r.request_id is None:
            continue
        layers = after.setdefault(r.request_id, {})
        key = str(r.layer if r.layer is not None else -1)
        layers[key] = layers.get(key, 0) + r.storage_bytes
        if state.get(r.request_id) != "orphaned":
            state[r.request_id] = s
    return after, state


def _lane_json(lane: Lane, after: Mapping[str, dict[str, int]], state: Mapping[str, str]) -> dict[str, Any]:
    rid = lane.request_id
    if lane.end is None:
        st = "active"
    elif rid in state:
        st = state[rid]
    else:
        st = "released"
    return {"id": rid, "tenant": lane.tenant, "start": round(lane.start, 6),
            "end": None if lane.end is None else round(lane.end, 6),
            "released": None if lane.freed is None or rid in state else round(lane.freed, 6),
            "bytes": lane.bytes, "after_end": after.get(rid, {}), "state": st}


def _event_json(e: Event, origin: float) -> dict[str, Any]:
    return {"t": round(e.ts - origin, 6), "kind": e.kind, "entry": e.entry_id, "request": e.request_id,
            "tenant": e.tenant, "layer": e.layer, "bytes": e.nbytes, "detail": e.detail, "scope": e.scope,
            "cache": e.cache}


def timeline_json(tl: Timeline, now: float, records: Sequence[Any], events: Sequence[Any], *,
                  events_dropped: int) -> dict[str, Any]:
    """The report's ``summary["timeline"]``: samples, lanes with what outlived each request, the newest
    events and the entries alive now (`records`: the snapshot's; `events`: the ledger's buffer, which dropped
    ``events_dropped`` older ones)."""
    events_seen = len(events) + events_dropped
    after, state = _after_end(records)
    origin = tl.origin
    alive = [{"entry": r.entry_id, "request": r.request_id, "tenant": r.tenant, "layer": r.layer, "kind": r.kind,
              "bytes": r.storage_bytes, "state": r.state.value, "created": round(r.created - origin, 6)}
             for r in records[:_ENTRIES]]
    kept = list(events)[-_EVENTS:]
    return {
        "version": VERSION, "origin": origin, "origin_unix": tl.origin_unix, "now": round(now - origin, 6),
        "interval_s": tl.interval_s, "capacity": tl.capacity, "stride": tl.stride,
        "columns": ["t", "live", "retained", "orphaned", "released"],
        "samples": [[round(s[0], 6), int(s[1]), int(s[2]), int(s[3]), int(s[4])] for s in tl.samples],
        "requests": [_lane_json(lane, after, state) for lane in tl.lanes.values()],
        "requests_seen": tl.requests_seen, "requests_dropped": tl.lanes_dropped,
        "events": [_event_json(e, origin) for e in kept], "events_seen": events_seen,
        "events_dropped": events_dropped + len(events) - len(kept),
        "entries": alive, "entries_total": len(records),
    }
