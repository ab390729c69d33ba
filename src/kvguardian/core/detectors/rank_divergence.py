"""KVG106 rank-divergence: ranks disagree on which sequences' KV are alive.

`sequence_summary` reduces one rank's ledger to what the ranks must agree on (per sequence: bytes alive,
storages, whether active), never KV contents or prompt text; `kvguardian.runtime.ranks` gathers the summaries (a
collective), and `compare` (pure) turns disagreements into findings. Details: docs/design/detectors.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvguardian.core.findings import Finding, Severity
from kvguardian.core.ledger import LedgerSnapshot

__all__ = ["MAX_FINDINGS", "compare", "sequence_summary"]

#: Findings kept per comparison; the rest are counted in the last one's evidence.
MAX_FINDINGS = 100


def sequence_summary(snapshot: LedgerSnapshot, *, rank: int, world_size: int) -> dict[str, Any]:
    """One rank's ledger, per sequence: what the ranks compare. JSON- and pickle-ready, bounded by live KV."""
    seqs: dict[str, dict[str, Any]] = {}
    for rec in snapshot.records:
        if rec.request_id is None:
            continue
        s = seqs.get(rec.request_id)
        if s is None:
            info = snapshot.requests.get(rec.request_id)
            s = seqs[rec.request_id] = {
                "bytes": 0, "entries": 0, "active": bool(info is not None and info.active),
                "tokens": set(), "layers": set(),
            }
        s["bytes"] += rec.storage_bytes
        s["entries"] += 1
        if rec.seq_len is not None:
            s["tokens"].add(rec.seq_len)
        if rec.layer is not None:
            s["layers"].add(rec.layer)
    for s in seqs.values():
        s["tokens"] = sorted(s["tokens"])
        s["layers"] = sorted(s["layers"])
    active = sorted(rid for rid, info in snapshot.requests.items() if info.active)
    return {
        "rank": rank,
        "world_size": world_size,
        "generation": snapshot.generation,
        "sequences": seqs,
        "active": active,
        "total_bytes": sum(s["bytes"] for s in seqs.values()),
    }


def _ranks(xs: Sequence[int]) -> str:
    return ("rank " if len(xs) == 1 else "ranks ") + ", ".join(map(str, xs))


def compare(summaries: Sequence[Mapping[str, Any]], *, exact_bytes: bool = False) -> list[Finding]:
    """Compare per-rank summaries (one per rank, any order); one KVG106 finding per divergent sequence."""
    by_rank = {int(s["rank"]): s for s in summaries}
    ranks = sorted(by_rank)
    seq_ids: set[str] = set()
    for s in summaries:
        seq_ids.update(s["sequences"])
    findings: list[Finding] = []
    skipped = 0
    for sid in sorted(seq_ids):
        nbytes = {r: int(by_rank[r]["sequences"].get(sid, {}).get("bytes", 0)) for r in ranks}
        entries = {r: int(by_rank[r]["sequences"].get(sid, {}).get("entries", 0)) for r in ranks}
        active = {r: sid in set(by_rank[r].get("active", ())) for r in ranks}
        holding = [r for r in ranks if nbytes[r] > 0]
        empty = [r for r in ranks if nbytes[r] == 0]
        ended = [r for r in ranks if not active[r]]
        running = [r for r in ranks if active[r]]
        if holding and empty:
            held = ", ".join(f"rank {r}: {nbytes[r]} bytes in {entries[r]} storages" for r in holding)
            state = "its owner ended" if all(not active[r] for r in holding) else "its owner is active"
            message = f"sequence {sid!r}: KV alive on {_ranks(holding)} ({held}; {state}) but not on {_ranks(empty)}"
        elif holding and ended and running:
            message = (
                f"sequence {sid!r} ended on {_ranks(ended)} but is active on {_ranks(running)} while "
                f"{sum(nbytes.values())} bytes of its KV are held"
            )
        elif exact_bytes and len(set(nbytes.values())) > 1:
            message = f"sequence {sid!r}: ranks hold different KV bytes: " + ", ".join(
                f"rank {r}: {nbytes[r]}" for r in ranks
            )
        else:
            continue
        if len(findings) >= MAX_FINDINGS:
            skipped += 1
            continue
        first = by_rank[holding[0]]["sequences"][sid] if holding else {}
        findings.append(
            Finding(
                id="KVG106",
                severity=Severity.ERROR,
                message=message,
                evidence={
                    "sequence": sid,
                    "ranks": ranks,
                    "ranks_holding": holding,
                    "ranks_released": empty,
                    "bytes_by_rank": {str(r): nbytes[r] for r in ranks},
                    "entries_by_rank": {str(r): entries[r] for r in ranks},
                    "active_by_rank": {str(r): active[r] for r in ranks},
                    "tokens": list(first.get("tokens", [])),
                    "layers": list(first.get("layers", [])),
                },
            )
        )
    if skipped and findings:
        findings[-1].evidence["more_divergent_sequences"] = skipped
    return findings

