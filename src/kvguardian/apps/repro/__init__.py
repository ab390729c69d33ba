"""Reproductions of the article's anti-patterns: each measures here, prints the article's claim beside it,
runs the detector, and verifies the fix.

Each reproduction module defines ``NAME``, ``SECTION``, ``TITLE``, ``add_arguments(parser)`` (its own
options; ``kv-guardian repro`` adds ``--json`` to every one), ``run(args) -> ReproResult``,
``render(data, out)`` (its measurements, through a `kvguardian.core.report.reporter.Reporter`) and
``demo_row() -> DemoRow``. Register it in `REPROS` (the order is the
demo table's order).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from kvguardian.core.report.reporter import Reporter

__all__ = ["ARTICLE_SECTIONS", "REPROS", "DemoRow", "Renderer", "ReproResult", "load", "not_built_rows",
           "section_order", "verdict_line"]

#: reproduction name -> module, in the order of the article's sections.
REPROS: dict[str, str] = {
    "grad-tracking": "kvguardian.apps.repro.grad_tracking",
    "orphaned": "kvguardian.apps.repro.orphaned",
    "cross-request": "kvguardian.apps.repro.cross_request",
    "nonpow2": "kvguardian.apps.repro.nonpow2",
    "multimodal-ranks": "kvguardian.apps.repro.multimodal",
    "hot-reload": "kvguardian.apps.repro.hot_reload",
}


#: The article's five anti-patterns: section -> (reproduction name, the article's claim). `kv-guardian demo`
#: shows a "not built yet" row for a section whose reproduction is not in REPROS, instead of dropping it.
ARTICLE_SECTIONS: dict[str, tuple[str, str]] = {
    "§2.1": ("grad-tracking", "1,024 ctx → 2.1 GiB, 8,192 → 18.7 GiB; O(n²) graph retention"),
    "§2.2": ("cross-request", "dynamic batching hands one request's KV blocks to another; isolation costs "
                              "128 → 116 QPS, 42 → 47 ms"),
    "§2.3": ("nonpow2", "FlashAttention-2 leaks ≈151 MB at length 1023, none at 1024"),
    "§2.4": ("multimodal-ranks", "Rank 0 holds 128 visual-KV refs, Rank 1 holds 0"),
    "§2.5": ("hot-reload", "hot reload leaves the old generation's KV handles alive"),
}


def load(name: str) -> ModuleType:
    return importlib.import_module(REPROS[name])


def not_built_rows() -> list[DemoRow]:
    """A placeholder row for each article section whose reproduction is not registered."""
    return [
        DemoRow(name, section, claim, "not built yet", "—", None, ok=True, details={"not_built": True})
        for section, (name, claim) in ARTICLE_SECTIONS.items()
        if name not in REPROS
    ]


def verdict_line(out: Reporter, text: str) -> None:
    """How a reproduction's rendering ends: a blank line, then ``verdict: text`` in strong type."""
    out.text("")
    out.text(f"verdict: {text}", tone="strong")


def section_order(row: DemoRow) -> tuple[int, str]:
    """Demo order: the article's sections in order, then our own reproductions."""
    return (0, row.section) if row.section.startswith("§") else (1, row.name)


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
    seconds: float = 0.0  # set by `kv-guardian demo`, which times each row
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


#: A reproduction's renderer: its measurements (``data``) to a reporter, after the heading.
Renderer = Callable[[dict[str, Any], Reporter], None]


@dataclass
class ReproResult:
    """What ``kv-guardian repro NAME`` measured: data for ``--json`` and a renderer for people."""

    name: str
    section: str
    title: str
    data: dict[str, Any]  # everything measured, JSON-ready
    render: Renderer | None = None  # the module's render(data, out)
    ok: bool = True  # detector verdicts and fixes came out as the reproduction expects

    def show(self, out: Reporter) -> None:
        """The heading (section and title), then what the reproduction's renderer says about ``data``."""
        out.heading(f"{self.section} {self.title}".strip())
        if self.render is not None:
            self.render(self.data, out)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "section": self.section, "title": self.title, "ok": self.ok, **self.data}
