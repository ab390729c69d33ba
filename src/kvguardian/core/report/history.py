"""The KV history in a report (``summary["timeline"]``): its schema, and the one reader of it that the HTML
report, the PyTorch memory-snapshot export and the trace export share.

Schema version 1: fields are only added, never renamed or removed; times are seconds since ``origin``. It holds
the sampled bytes by state, each request's span, the buffered lifecycle events and the entries alive at the
report, all bounded. The field-by-field schema: docs/design/report.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvguardian.core.errors import UsageError

__all__ = ["COLUMNS", "VERSION", "AliveEntry", "History", "KVEvent", "RequestSpan", "Sample", "read_history"]

VERSION = 1
COLUMNS = ("t", "live", "retained", "orphaned", "released")
STATES = ("active", "released", "retained", "orphaned")


@dataclass(frozen=True)
class Sample:
    t: float
    live: float
    retained: float
    orphaned: float
    released: float  # cumulative

    @property
    def alive(self) -> float:
        return self.live + self.retained + self.orphaned


@dataclass(frozen=True)
class RequestSpan:
    id: str
    tenant: str | None
    start: float
    end: float | None  # None: still active
    released: float | None  # when its last KV was freed; None: not (yet) known to be freed
    bytes: int
    after_end: dict[int, int]  # layer (-1: unknown) -> bytes alive after the end
    state: str  # one of STATES

    @property
    def bytes_after_end(self) -> int:
        return sum(self.after_end.values())


@dataclass(frozen=True)
class KVEvent:
    t: float
    kind: str
    entry: int
    request: str | None
    tenant: str | None
    layer: int | None
    bytes: int
    detail: str | None
    scope: str
    cache: str | None


@dataclass(frozen=True)
class AliveEntry:
    entry: int
    request: str | None
    tenant: str | None
    layer: int | None
    kind: str
    bytes: int
    state: str  # live | retained | orphaned
    created: float


@dataclass(frozen=True)
class History:
    origin: float
    origin_unix: float | None
    now: float
    interval_s: float | None
    stride: int
    samples: tuple[Sample, ...]
    requests: tuple[RequestSpan, ...]
    requests_seen: int
    requests_dropped: int
    events: tuple[KVEvent, ...]
    events_seen: int
    events_dropped: int
    entries: tuple[AliveEntry, ...] = ()
    entries_total: int = 0

    @property
    def end(self) -> float:
        """The last time anything in the history happened (at least ``now``)."""
        last = [self.now]
        if self.samples:
            last.append(self.samples[-1].t)
        return max(last)


def _num(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise UsageError(f"{what} is {str(v)[:40]!r}, not a finite number")
    return float(v)


def _opt(v: object, what: str) -> float | None:
    return None if v is None else _num(v, what)


def _int(v: object, what: str, default: int = 0) -> int:
    return default if v is None else int(_num(v, what))


def _str(v: object) -> str | None:
    return None if v is None else str(v)


def _samples(tl: Mapping[str, Any]) -> tuple[Sample, ...]:
    cols = tl.get("columns", list(COLUMNS))
    if not isinstance(cols, list) or not set(COLUMNS) <= set(cols):
        raise UsageError(f"timeline columns {str(cols)[:80]} lack some of {list(COLUMNS)}")
    idx = [cols.index(c) for c in COLUMNS]
    rows = tl.get("samples") or []
    if not isinstance(rows, list):
        raise UsageError("timeline samples are not a list")
    out = []
    for n, row in enumerate(rows):
        if not isinstance(row, list) or len(row) < len(cols):
            raise UsageError(f"timeline sample {n} is not a row of {len(cols)} numbers")
        out.append(Sample(*(_num(row[i], f"timeline sample {n} {c}") for i, c in zip(idx, COLUMNS))))
    return tuple(sorted(out, key=lambda s: s.t))


def _after_end(v: object, what: str) -> dict[int, int]:
    if not v:
        return {}
    if not isinstance(v, Mapping):
        raise UsageError(f"{what} after_end is not an object")
    out: dict[int, int] = {}
    for k, b in v.items():
        try:
            layer = int(k)
        except (TypeError, ValueError):
            layer = -1
        out[layer] = out.get(layer, 0) + _int(b, f"{what} after_end[{k}]")
    return out


def _objects(tl: Mapping[str, Any], key: str, what: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The objects of list ``tl[key]``, each with its name for error messages (``timeline event 3``)."""
    items = tl.get(key) or []
    if not isinstance(items, list):
        raise UsageError(f"timeline {key} are not a list")
    out = []
    for n, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise UsageError(f"timeline {what} {n} is not an object")
        out.append((f"timeline {what} {n}", item))
    return out


def _layer(v: object, what: str) -> int | None:
    return None if v is None else _int(v, f"{what} layer")


def _requests(tl: Mapping[str, Any]) -> tuple[RequestSpan, ...]:
    out = []
    for what, r in _objects(tl, "requests", "request"):
        if r.get("id") is None:
            raise UsageError(f"{what} has no id")
        state = str(r.get("state") or ("active" if r.get("end") is None else "released"))
        out.append(RequestSpan(
            id=str(r["id"]), tenant=_str(r.get("tenant")), start=_num(r.get("start"), f"{what} start"),
            end=_opt(r.get("end"), f"{what} end"), released=_opt(r.get("released"), f"{what} released"),
            bytes=_int(r.get("bytes"), f"{what} bytes"), after_end=_after_end(r.get("after_end"), what),
            state=state if state in STATES else "released",
        ))
    return tuple(sorted(out, key=lambda r: r.start))


def _events(tl: Mapping[str, Any]) -> tuple[KVEvent, ...]:
    return tuple(KVEvent(
        t=_num(e.get("t"), f"{what} t"), kind=str(e.get("kind")), entry=_int(e.get("entry"), f"{what} entry"),
        request=_str(e.get("request")), tenant=_str(e.get("tenant")), layer=_layer(e.get("layer"), what),
        bytes=_int(e.get("bytes"), f"{what} bytes"), detail=_str(e.get("detail")), scope=str(e.get("scope") or "entry"),
        cache=_str(e.get("cache")),
    ) for what, e in _objects(tl, "events", "event"))


def _entries(tl: Mapping[str, Any]) -> tuple[AliveEntry, ...]:
    return tuple(AliveEntry(
        entry=_int(e.get("entry"), f"{what} entry"), request=_str(e.get("request")), tenant=_str(e.get("tenant")),
        layer=_layer(e.get("layer"), what), kind=str(e.get("kind") or "kv"),
        bytes=_int(e.get("bytes"), f"{what} bytes"), state=str(e.get("state") or "live"),
        created=_num(e.get("created", 0.0), f"{what} created"),
    ) for what, e in _objects(tl, "entries", "entry"))


def read_history(tl: Mapping[str, Any]) -> History:
    """Validate a report's timeline. Raises `UsageError` naming the first damaged field."""
    if not isinstance(tl, Mapping):
        raise UsageError("the timeline is not an object")
    if tl.get("version") != VERSION:
        raise UsageError(f"timeline version {tl.get('version')!r}; this kv-guardian reads version {VERSION}")
    samples = _samples(tl)
    requests = _requests(tl)
    events = _events(tl)
    return History(
        origin=_num(tl.get("origin", 0.0), "timeline origin"), origin_unix=_opt(tl.get("origin_unix"), "origin_unix"),
        now=_num(tl.get("now", samples[-1].t if samples else 0.0), "timeline now"),
        interval_s=_opt(tl.get("interval_s"), "timeline interval_s"),
        stride=max(1, _int(tl.get("stride"), "stride", 1)),
        samples=samples, requests=requests,
        requests_seen=_int(tl.get("requests_seen"), "requests_seen", len(requests)),
        requests_dropped=_int(tl.get("requests_dropped"), "requests_dropped"),
        events=events, events_seen=_int(tl.get("events_seen"), "events_seen", len(events)),
        events_dropped=_int(tl.get("events_dropped"), "events_dropped"),
        entries=(entries := _entries(tl)), entries_total=_int(tl.get("entries_total"), "entries_total", len(entries)),
    )


def as_rows(samples: Sequence[Sample]) -> list[list[float]]:
    return [[s.t, s.live, s.retained, s.orphaned, s.released] for s in samples]
