"""Detectors: pure functions from a ledger snapshot (plus precomputed holder chains) to findings.

Each detector lives in its own module and has the signature ``detect(snapshot, ctx) -> list[Finding]``; what
they share (`DetectContext`, the holder-chain helpers) is in `kvguardian.core.detectors.context`. `run_all` runs the
registered ones in order. Holder chains need the live object graph, so the check pipeline (`kvguardian.runtime.check`)
computes them before calling the detectors and passes them in `DetectContext`.
"""

from __future__ import annotations

from kvguardian.core.detectors.context import DetectContext, Detector, best_chain, chain_evidence, held_finding
from kvguardian.core.findings import Finding
from kvguardian.core.ledger import LedgerSnapshot

__all__ = ["DETECTORS", "DetectContext", "Detector", "best_chain", "chain_evidence", "held_finding", "run_all"]


def _registry() -> list[Detector]:
    """The detectors `run_all` runs, in order (KVG106 compares ranks: see `kvguardian.runtime.ranks`). Imported on first
    use: the growth test needs numpy."""
    from kvguardian.core.detectors import degraded, grad_tracked, growth, orphaned, stale_generation, unknown_layout

    return [
        grad_tracked.detect,  # KVG101
        orphaned.detect,  # KVG102
        growth.detect,  # KVG103
        stale_generation.detect,  # KVG105
        degraded.detect,  # KVG100
        unknown_layout.detect,  # KVG107
    ]


DETECTORS: list[Detector] = []


def run_all(snapshot: LedgerSnapshot, ctx: DetectContext) -> list[Finding]:
    if not DETECTORS:
        DETECTORS.extend(_registry())
    out: list[Finding] = []
    for det in DETECTORS:
        out.extend(det(snapshot, ctx))
    return out
