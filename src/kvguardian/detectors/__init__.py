"""Detectors: pure functions from a ledger snapshot (plus precomputed holder chains) to findings.

Each detector lives in its own module and has the signature ``detect(snapshot, ctx) -> list[Finding]``.
`run_all` runs the registered ones in order. Holder chains need the live object graph, so the guard
computes them before calling the detectors and passes them in `DetectContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvguardian.findings import Finding
from kvguardian.ledger import LedgerSnapshot
from kvguardian.tensors.holders import HolderChain

__all__ = ["DETECTORS", "DetectContext", "Detector", "run_all"]


@dataclass(frozen=True)
class DetectContext:
    """What a detector may read besides the snapshot."""

    holder_chains: Mapping[Any, HolderChain] = field(default_factory=dict)  # entry key -> chain
    growth_alpha: float = 1e-5  # significance level of the growth trend test
    growth_min_bytes: int = 0  # ignore growth smaller than this over the tested window
    options: Mapping[str, Any] = field(default_factory=dict)


Detector = Callable[[LedgerSnapshot, DetectContext], list[Finding]]


def _registry() -> list[Detector]:
    from kvguardian.detectors import grad_tracked, growth, orphaned, stale_generation

    return [grad_tracked.detect, orphaned.detect, growth.detect, stale_generation.detect]


DETECTORS: list[Detector] = []


def run_all(snapshot: LedgerSnapshot, ctx: DetectContext) -> list[Finding]:
    if not DETECTORS:
        DETECTORS.extend(_registry())
    out: list[Finding] = []
    for det in DETECTORS:
        out.extend(det(snapshot, ctx))
    return out
