"""The KV lifecycle as a Chrome trace (the JSON ``traceEvents`` format that Perfetto, ``chrome://tracing`` and
speedscope open)::

    kv-guardian report run.json --trace kv-trace.json      # then open it in ui.perfetto.dev (offline copy works)

Requests are complete events packed onto lanes, KV alive after its request's end an async span, bytes by
state counter tracks, lifecycle events and findings instants. The event mapping: docs/design/report.md.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvguardian.core.report.document import tool_version
from kvguardian.core.report.history import History, RequestSpan

__all__ = ["TraceAudit", "chrome_trace", "write_trace"]

MAX_INSTANTS = 20_000  # lifecycle events per audit (the newest); the counters carry the rest
MAX_FINDINGS = 200


@dataclass(frozen=True)
class TraceAudit:
    label: str
    history: History
    findings: Sequence[Mapping[str, Any]]  # id, name, severity, message


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def _lanes(requests: Sequence[RequestSpan], end: float) -> dict[str, int]:
    """Request id -> lane (tid, from 1), greedily: the lowest lane free when the request starts."""
    free: list[int] = []
    busy: list[tuple[float, int]] = []
    lanes: dict[str, int] = {}
    count = 0
    for r in sorted(requests, key=lambda r: r.start):
        while busy and busy[0][0] <= r.start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            count += 1
            lane = count
        lanes[r.id] = lane
        heapq.heappush(busy, (r.end if r.end is not None else end, lane))
    return lanes


def _spans(pid: int, hist: History, lanes: Mapping[str, int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    end = hist.end
    for n, r in enumerate(hist.requests):
        tid = lanes[r.id]
        stop = r.end if r.end is not None else end
        args = {"tenant": r.tenant, "bytes": r.bytes, "state": r.state}
        out.append({"name": r.id, "cat": "request", "ph": "X", "pid": pid, "tid": tid, "ts": _us(r.start),
                    "dur": _us(max(0.0, stop - r.start)), "args": args})
        if r.end is None:
            continue
        tail_end = end if r.bytes_after_end else r.released
        if tail_end is not None and tail_end > r.end:
            common = {"name": f"KV after end: {r.id}", "cat": "kv-after-end", "pid": pid, "tid": tid,
                      "id": f"0x{n + 1:x}"}
            out.append({**common, "ph": "b", "ts": _us(r.end),
                        "args": {"state": r.state if r.bytes_after_end else "freed later",
                                 "bytes": r.bytes_after_end or r.bytes,
                                 "layers": sorted(k for k in r.after_end if k >= 0)}})
            out.append({**common, "ph": "e", "ts": _us(tail_end), "args": {}})
    return out


def _counters(pid: int, hist: History) -> list[dict[str, Any]]:
    out = []
    for s in hist.samples:
        ts = _us(s.t)
        out.append({"name": "KV bytes", "ph": "C", "pid": pid, "ts": ts,
                    "args": {"live": s.live, "retained": s.retained, "orphaned": s.orphaned}})
        out.append({"name": "KV released so far", "ph": "C", "pid": pid, "ts": ts, "args": {"bytes": s.released}})
    return out


def _instants(pid: int, hist: History, lanes: Mapping[str, int]) -> list[dict[str, Any]]:
    out = []
    for e in hist.events[-MAX_INSTANTS:]:
        tid = lanes.get(e.request, 0) if e.request is not None else 0
        args = {k: v for k, v in (("entry", e.entry), ("layer", e.layer), ("bytes", e.bytes), ("detail", e.detail),
                                  ("request", e.request), ("cache", e.cache)) if v is not None}
        out.append({"name": f"{e.scope} {e.kind}", "cat": "kv-event", "ph": "i", "s": "t", "pid": pid, "tid": tid,
                    "ts": _us(e.t), "args": args})
    return out


def _meta(pid: int, label: str, lanes: Mapping[str, int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                                  "args": {"name": f"kv-guardian KV: {label}"}},
                                 {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0,
                                  "args": {"name": "lifecycle events"}}]
    for lane in sorted(set(lanes.values())):
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": lane, "args": {"name": f"requests {lane}"}})
    return out


def chrome_trace(audits: Sequence[TraceAudit]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for pid, audit in enumerate(audits, 1):
        hist = audit.history
        lanes = _lanes(hist.requests, hist.end)
        events.extend(_meta(pid, audit.label, lanes))
        events.extend(_counters(pid, hist))
        events.extend(_spans(pid, hist, lanes))
        events.extend(_instants(pid, hist, lanes))
        for f in list(audit.findings)[:MAX_FINDINGS]:
            events.append({"name": f"{f.get('id')} {f.get('name', '')}".strip(), "cat": "finding", "ph": "i",
                           "s": "g", "pid": pid, "tid": 0, "ts": _us(hist.end),
                           "args": {"severity": f.get("severity"), "message": f.get("message")}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "kv-guardian", "version": tool_version()}}


def write_trace(audits: Sequence[TraceAudit], path: str | Path) -> int:
    body = json.dumps(chrome_trace(audits), ensure_ascii=False, allow_nan=False).encode("utf-8")
    Path(path).write_bytes(body)
    return len(body)
