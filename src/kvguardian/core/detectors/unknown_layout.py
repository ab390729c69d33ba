"""KVG107 unknown-cache-layout: a cache or cache-layer class kv-guardian does not know was audited through the
generic path (every tensor it returns or holds), so its accounting is approximate.

The transformers source notes each such class once (`Ledger.notes.unknown`); one finding per class.
"""

from __future__ import annotations

from kvguardian.core.detectors.context import DetectContext
from kvguardian.core.findings import Finding, Severity
from kvguardian.core.ledger import LedgerSnapshot

__all__ = ["detect"]


def detect(snapshot: LedgerSnapshot, ctx: DetectContext) -> list[Finding]:
    return [
        Finding(
            id="KVG107",
            severity=Severity.WARNING,
            message=f"cache class {cls} is not one kv-guardian knows; audited through the generic path ({why})",
            evidence={"class": cls, "reason": why, "call_site": snapshot.unknown_sites.get(cls)},
        )
        for cls, why in sorted(snapshot.unknown_classes.items())
    ]
