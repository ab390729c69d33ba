"""KVG105 stale-generation: KV of a retired model generation is still alive after a reload.

A reload (``guard.new_generation()``) retires every earlier generation: KV computed with the old weights is
never valid for the new model, so once the requests that were running at the reload have ended, none of it
should be alive, whether or not it was declared retained (a declared prefix cache of the old model is stale
too). An old-generation entry whose owner request is still active is not reported: a request that began
before the reload may finish on the old KV.

One finding per retired generation, with its bytes, entries, owners and the holder chain of one entry (the
guard searches chains for these entries as for orphaned ones).
"""

from __future__ import annotations

from collections import defaultdict

from kvguardian.core.detectors.context import DetectContext, held_finding
from kvguardian.core.findings import Finding, Severity
from kvguardian.core.ledger import EntryState, LedgerSnapshot, Record

__all__ = ["detect", "stale_records"]


def stale_records(snapshot: LedgerSnapshot) -> list[Record]:
    """Entries of a generation older than the snapshot's whose owner is not an active request."""
    out = []
    for rec in snapshot.records:
        if rec.generation >= snapshot.generation:
            continue
        info = snapshot.requests.get(rec.request_id) if rec.request_id is not None else None
        if info is not None and info.active:
            continue
        out.append(rec)
    return out


def detect(snapshot: LedgerSnapshot, ctx: DetectContext) -> list[Finding]:
    groups: dict[int, list[Record]] = defaultdict(list)
    for rec in stale_records(snapshot):
        groups[rec.generation].append(rec)
    findings = []
    for gen in sorted(groups):
        recs = sorted(groups[gen], key=lambda r: r.entry_id)
        nbytes = sum(r.storage_bytes for r in recs)
        retained = sum(r.storage_bytes for r in recs if r.state is EntryState.RETAINED)
        owners = sorted({r.request_id for r in recs if r.request_id is not None})
        reasons = sorted({r.retained_reason for r in recs if r.retained_reason})
        evidence = {
            "generation": gen,
            "current_generation": snapshot.generation,
            "generations_behind": snapshot.generation - gen,
            "entries": len(recs),
            "bytes": nbytes,
            "retained_bytes": retained,
            "orphaned_bytes": nbytes - retained,
            "owners": owners[:20],
            "owners_total": len(owners),
            "layers": sorted({r.layer for r in recs if r.layer is not None}),
            "sources": sorted({r.source for r in recs}),
            "declared_reasons": reasons,
        }
        declared = f" ({retained} bytes of it declared retained: {', '.join(reasons)})" if retained else ""
        message = (f"{nbytes} bytes of KV ({len(recs)} storages) from model generation {gen} are alive in "
                   f"generation {snapshot.generation}")
        findings.append(held_finding(Finding("KVG105", Severity.ERROR, message, evidence), recs, ctx, declared))
    return findings
