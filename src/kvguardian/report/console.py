"""Terminal rendering with rich. Reports never contain KV contents or prompt text."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from kvguardian.findings import Report, Severity

__all__ = ["console", "print_report", "print_table"]

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def console(stderr: bool = False) -> Any:
    """A rich console; when the output is not a terminal (a pipe, a CI log) tables get 160 columns, not 80."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 160
    return Console(file=stream, soft_wrap=False, highlight=False, width=width)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, out: Any = None) -> None:
    from rich.table import Table

    table = Table(title=title, show_lines=True, expand=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    (out or console()).print(table)


def print_report(report: Report, *, out: Any = None, max_findings: int = 50) -> None:
    """Findings, worst first, each with its message, holder chain and fix; then the summary line."""
    con = out or console()
    findings = sorted(report.findings, key=lambda f: -f.severity.rank)
    for f in findings[:max_findings]:
        con.print(f"[{_STYLE[f.severity]}]{f.id} {f.name} ({f.severity.value})[/] {f.message}", markup=True)
        if f.holder_chain:
            con.print("  held by: " + f.render_chain(), markup=False)
        con.print(f"  fix: {f.fix}", markup=False)
    if len(findings) > max_findings:
        con.print(f"… and {len(findings) - max_findings} more (see the JSON report)")
    counts = report.counts()
    con.print(
        f"{len(findings)} finding(s): {counts['error']} error, {counts['warning']} warning, {counts['info']} info",
        markup=False,
    )
