"""KVG100 guard-degraded: instrumentation errors were contained (fail-open), so the ledger may be incomplete.

Every hook site counts the errors it swallowed (`kvguardian.core.faults`); one finding lists them by site.
"""

from __future__ import annotations

from kvguardian.core.detectors.context import DetectContext
from kvguardian.core.findings import Finding, Severity
from kvguardian.core.ledger import LedgerSnapshot

__all__ = ["detect"]


def detect(snapshot: LedgerSnapshot, ctx: DetectContext) -> list[Finding]:
    errors = sum(snapshot.instrumentation_errors.values())
    if not errors:
        return []
    return [
        Finding(
            id="KVG100",
            severity=Severity.WARNING,
            message=(
                f"{errors} instrumentation error(s) were contained (fail-open) at "
                f"{sorted(snapshot.instrumentation_errors)}; the ledger may be incomplete"
            ),
            evidence={"errors_by_site": dict(snapshot.instrumentation_errors)},
        )
    ]
