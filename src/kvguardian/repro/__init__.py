"""Reproductions of the article's anti-patterns: each measures here, prints the article's claim beside it,
runs the detector, and verifies the fix.

Each reproduction module defines ``NAME``, ``SECTION``, ``TITLE``, ``add_arguments(parser)``,
``run(args) -> ReproResult`` and ``demo_row() -> DemoRow``. Register it in `REPROS` (the order is the
demo table's order).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["REPROS", "DemoRow", "ReproResult", "load"]

#: reproduction name -> module, in the order of the article's sections.
REPROS: dict[str, str] = {
    "grad-tracking": "kvguardian.repro.grad_tracking",
    "orphaned": "kvguardian.repro.orphaned",
    "nonpow2": "kvguardian.repro.nonpow2",
    "multimodal-ranks": "kvguardian.repro.multimodal",
    "hot-reload": "kvguardian.repro.hot_reload",
}


def load(name: str) -> ModuleType:
    return importlib.import_module(REPROS[name])


@dataclass
class DemoRow:
    """One row of ``kv-guardian demo``."""

    name: str
    section: str  # "§2.1", or "" for ours
    article_claim: str
    measured: str
    verdict: str  # what the detector said
    fix_verified: bool | None  # None: no fix to verify
    ok: bool = True  # the reproduction ran and the detector behaved as expected
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "section": self.section,
            "article_claim": self.article_claim,
            "measured": self.measured,
            "verdict": self.verdict,
            "fix_verified": self.fix_verified,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "details": self.details,
        }


@dataclass
class ReproResult:
    """What ``kv-guardian repro NAME`` measured: data for ``--json`` plus text for the terminal."""

    name: str
    section: str
    title: str
    data: dict[str, Any]  # everything measured, JSON-ready
    lines: list[str] = field(default_factory=list)  # the readable report, one line each
    ok: bool = True  # detector verdicts and fixes came out as the reproduction expects

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "section": self.section, "title": self.title, "ok": self.ok, **self.data}
