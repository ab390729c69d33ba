"""KVG102 orphaned-kv: KV storage alive after its owner ended, not declared retained.

One finding per owner request, with the bytes, the layers, and the holder chain of its first entry
(the guard computes chains after ``gc.collect()``, so everything here is really reachable).
"""

from __future__ import annotations

from collections import defaultdict

from kvguardian.core.detectors.context import DetectContext, held_finding
from kvguardian.core.findings import Finding, Severity
from kvguardian.core.ledger import EntryState, LedgerSnapshot, Record

__all__ = ["detect"]


def detect(snapshot: LedgerSnapshot, ctx: DetectContext) -> list[Finding]:
    groups: dict[str | None, list[Record]] = defaultdict(list)
    for rec in snapshot.records:
        if rec.state is EntryState.ORPHANED:
            groups[rec.request_id].append(rec)
    findings = []
    for rid, recs in groups.items():
        recs.sort(key=lambda r: (r.layer if r.layer is not None else -1, r.kind, r.entry_id))
        nbytes = sum(r.storage_bytes for r in recs)
        layers = sorted({r.layer for r in recs if r.layer is not None})
        info = snapshot.requests.get(rid) if rid is not None else None
        ended_ago = (snapshot.taken - info.ended) if info is not None and info.ended is not None else None
        evidence = {
            "request_id": rid,
            "tenant": recs[0].tenant,
            "generation": recs[0].generation,
            "entries": len(recs),
            "bytes": nbytes,
            "layers": layers,
            "kinds": sorted({r.kind for r in recs}),
            "sources": sorted({r.source for r in recs}),
            "roles": sorted({r.role for r in recs if r.role}),  # an encoder-decoder cache's "self" and "cross"
            "seconds_since_owner_ended": round(ended_ago, 3) if ended_ago is not None else None,
            "call_site": info.site if info is not None else None,  # the user's line that began the request
        }
        verdict = (ctx.options.get("retention") or {}).get(rid) if rid is not None else None
        severity = Severity.ERROR
        tail = ""
        if verdict is not None:
            evidence["retention"] = verdict.to_dict()
            severity = Severity.parse(verdict.severity)
            if verdict.bounded:
                tail = f"; retained but bounded: {verdict.detail}"
            elif verdict.collection:
                tail = f"; {verdict.detail} ({verdict.collection})"
            else:
                tail = f"; {verdict.detail}"
        message = (f"{nbytes} bytes of KV ({len(recs)} storages, layers {layers}) of request {rid!r} "
                   f"are alive after the request ended")
        findings.append(held_finding(Finding("KVG102", severity, message, evidence), recs, ctx, tail))
    return findings
