"""Report documents for the HTML report's tests and benchmark, built the way the producers build them.

`synthetic_report` writes a Guard report (schema 1) with a KV timeline (schema of `kvguardian.core.report.history`)
for ``n`` requests, every ``leak_every``-th of which leaves its KV in a dict (a KVG102 finding with a holder
chain), plus a KVG103 finding with its trend line when the leak grows. Sizes and times are deterministic.
Use it where a real run would cost minutes (100,000 requests); the real-producer tests use a real Guard.
"""

from __future__ import annotations

import random
from typing import Any

LAYERS = 4
BYTES_PER_LAYER = 8192


def _chain(i: int, root: str) -> list[str]:
    return [root, f"dict['user-{i}']", "Session.cache", "DynamicCache.layers", f"list[{i % LAYERS}]",
            "DynamicLayer.keys", f"Tensor[1×2×{16 + i % 7}×16] float32"]


def synthetic_report(n: int = 200, *, leak_every: int = 5, seed: int = 0, request_id: Any = None,
                     roots: tuple[str, ...] = ("module app: SESSIONS",), capacity: int = 2048,
                     max_lanes: int = 4096) -> dict[str, Any]:
    rng = random.Random(seed)
    t = 0.0
    live = retained = orphaned = released = 0
    samples: list[list[float]] = []
    requests: list[dict[str, Any]] = []
    findings: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    origin = 1000.0
    for i in range(n):
        rid = request_id(i) if request_id else f"r-{i}"
        start = t
        t += 0.05 + rng.random() * 0.05
        nbytes = LAYERS * 2 * BYTES_PER_LAYER
        live += nbytes
        samples.append([start, live, retained, orphaned, released])
        end = t
        leaked = leak_every > 0 and i % leak_every == 0
        live -= nbytes
        if leaked:
            orphaned += nbytes
            after = {str(layer): 2 * BYTES_PER_LAYER for layer in range(LAYERS)}
            root = roots[(i // leak_every) % len(roots)]
            findings.append({
                "id": "KVG102", "name": "orphaned-kv", "severity": "error",
                "message": f"{nbytes} bytes of KV of request {rid!r} are alive after the request ended",
                "evidence": {"request_id": rid, "tenant": "acme", "bytes": nbytes, "layers": list(range(LAYERS))},
                "holder_chain": _chain(i, root), "fix": "drop the reference named by the holder chain",
            })
        else:
            released += nbytes
            after = {}
        samples.append([end, live, retained, orphaned, released])
        if len(requests) < max_lanes:
            requests.append({"id": rid, "tenant": "acme" if i % 2 else "zen", "start": start, "end": end,
                             "released": None if leaked else end, "bytes": nbytes, "after_end": after,
                             "state": "orphaned" if leaked else "released"})
        for layer in range(LAYERS):
            for kind in ("k", "v"):
                eid = 1 + (i * LAYERS + layer) * 2 + (kind == "v")
                if len(events) < 20_000:
                    events.append({"t": start, "kind": "init", "entry": eid, "request": rid, "tenant": "acme",
                                   "layer": layer, "bytes": BYTES_PER_LAYER, "scope": "entry"})
                    if not leaked:
                        events.append({"t": end, "kind": "release", "entry": eid, "request": rid, "tenant": "acme",
                                       "layer": layer, "bytes": BYTES_PER_LAYER, "scope": "entry"})
                if leaked and len(entries) < 20_000:
                    entries.append({"entry": eid, "request": rid, "tenant": "acme", "layer": layer, "kind": kind,
                                    "bytes": BYTES_PER_LAYER, "state": "orphaned", "created": start})
    stride = 1
    while len(samples) > capacity:
        samples = [max(samples[k], samples[k + 1], key=lambda s: s[1] + s[2] + s[3]) for k in
                   range(0, len(samples) - 1, 2)]
        stride *= 2
    if leak_every and n // leak_every >= 16:
        findings.append({
            "id": "KVG103", "name": "kv-growth", "severity": "warning",
            "message": "retained KV grew over the last requests", "fix": "find what keeps each request's KV",
            "evidence": {"window_requests": 32, "trend_line": [[origin + t * 0.5, orphaned * 0.5],
                                                              [origin + t, float(orphaned)]]},
        })
    timeline = {
        "version": 1, "origin": origin, "origin_unix": 1_700_000_000.0, "now": t, "interval_s": 1.0,
        "capacity": capacity, "stride": stride, "columns": ["t", "live", "retained", "orphaned", "released"],
        "samples": samples, "requests": requests, "requests_seen": n, "requests_dropped": n - len(requests),
        "events": events, "events_seen": 4 * LAYERS * n, "events_dropped": max(0, 4 * LAYERS * n - len(events)),
        "entries": entries, "entries_total": len(entries),
    }
    summary = {"entries": len(findings) * LAYERS * 2, "requests_seen": n, "total_bytes": orphaned,
               "bytes": {"live": live, "retained": retained, "orphaned": orphaned}, "timeline": timeline}
    counts = {s: sum(1 for f in findings if f["severity"] == s) for s in ("info", "warning", "error")}
    return {"schema": 1, "tool": "kv-guardian", "created": 1_700_000_100.0, "summary": summary, "counts": counts,
            "findings": findings}
