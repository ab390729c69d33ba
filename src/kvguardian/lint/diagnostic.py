"""What the linter reports: a `Diagnostic` (a finding at a place in a file) and a `Skipped` file.

A diagnostic carries a finding id of the catalog (`kvguardian.core.findings.CATALOG`, ids KVG4xx), the file, a
1-based line and column, and one sentence. `to_finding` turns it into the `Finding` every other command
reports, with the location as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvguardian.core.findings import CATALOG, Finding, Severity

__all__ = ["Diagnostic", "LintResult", "Skipped"]


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One rule firing at one place. Ordered by file, line, column, rule."""

    path: str  # as given on the command line or found under it, '/'-separated
    line: int  # 1-based
    col: int  # 1-based
    rule: str  # "KVG401"
    message: str  # one sentence naming the object and the fix
    end_line: int = 0  # 0: same as line
    end_col: int = 0  # 0: unknown

    @property
    def severity(self) -> Severity:
        return CATALOG[self.rule].severity

    @property
    def name(self) -> str:
        return CATALOG[self.rule].name

    def to_finding(self) -> Finding:
        return Finding(self.rule, self.severity, f"{self.path}:{self.line}:{self.col}: {self.message}",
                       evidence={"path": self.path, "line": self.line, "col": self.col})


@dataclass(frozen=True)
class Skipped:
    """A file (or directory) that was not linted, and why, in one line: what, where, the fix."""

    path: str
    reason: str
    line: int = 0  # where parsing failed, when known


@dataclass
class LintResult:
    """Everything one lint run found; `files` and `lines` count what was actually linted."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    files: int = 0
    lines: int = 0
    suppressed: int = 0  # diagnostics silenced by a noqa comment

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.diagnostics:
            out[d.rule] = out.get(d.rule, 0) + 1
        return dict(sorted(out.items()))
