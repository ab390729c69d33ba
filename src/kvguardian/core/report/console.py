"""The console reporter: rich tables and lines on a terminal (or a pipe, a CI log).

Nothing is ever parsed as markup or emoji codes: every string becomes a rich ``Text`` after `visible`
escaped its control characters. Reports never contain KV contents or prompt text.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from kvguardian.core.findings import Finding, Report, Severity
from kvguardian.core.report.escape import visible
from kvguardian.core.report.reporter import Tone

__all__ = ["SEVERITY_STYLE", "ConsoleReporter", "console"]

#: The style of a finding's first line, by severity.
SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}

_TONE_STYLE: dict[str, str] = {"plain": "", "strong": "bold", "warning": "yellow", "error": "bold red"}


def console(stderr: bool = False, stream: IO[str] | None = None) -> Any:
    """A rich console that never interprets markup, emoji codes or highlights; when the output is not a
    terminal (a pipe, a CI log) tables get 160 columns, not 80."""
    from rich.console import Console

    out = stream if stream is not None else (sys.stderr if stderr else sys.stdout)
    tty = getattr(out, "isatty", lambda: False)()
    return Console(file=out, soft_wrap=False, highlight=False, markup=False, emoji=False,
                   width=None if tty else 160)


def _text(value: object, style: str = "") -> Any:
    from rich.text import Text

    return Text(visible(value), style=style)


class ConsoleReporter:
    """`kvguardian.core.report.reporter.Reporter` on a rich console (stdout unless a stream is given)."""

    def __init__(self, stream: IO[str] | None = None, *, stderr: bool = False) -> None:
        self.con = console(stderr=stderr, stream=stream)

    def heading(self, text: str) -> None:
        self.con.print(_text(text, "bold"), soft_wrap=True)

    def text(self, line: str, *, tone: Tone = "plain") -> None:
        self.con.print(_text(line, _TONE_STYLE.get(tone, "")), soft_wrap=True)

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        from rich.table import Table

        table = Table(title=_text(title), show_lines=True, expand=False)
        for col in columns:
            table.add_column(_text(col), overflow="fold")
        for row in rows:
            table.add_row(*(_text(c) for c in row))
        self.con.print(table)

    def findings(self, report: Report, *, per_group: int | None = None, limit: int = 50,
                 more: str = "the JSON report") -> None:
        ordered = sorted(report.findings, key=lambda f: -f.severity.rank)
        groups: dict[tuple[Any, ...], list[Finding]] = {}
        for i, f in enumerate(ordered):
            key: tuple[Any, ...] = (i,) if per_group is None else (
                f.id, f.severity.value, f.holder_chain[0] if f.holder_chain else "")
            groups.setdefault(key, []).append(f)
        shown = per_group or 1
        for items in list(groups.values())[:limit]:
            for f in items[:shown]:
                self._finding(f)
            if len(items) > shown:
                self.text(f"  … and {len(items) - shown} more like this (see {more})")
            self.text(f"  fix: {items[0].fix}")
        if len(groups) > limit:
            self.text(f"… and {len(groups) - limit} more (see {more})")
        counts = report.counts()
        self.text(f"{len(ordered)} finding(s): {counts['error']} error, {counts['warning']} warning, "
                  f"{counts['info']} info")

    def finding(self, f: Finding) -> None:
        """One finding's first line alone (a live watch shows each new finding as it appears)."""
        self._finding(f, chain=False)

    def _finding(self, f: Finding, *, chain: bool = True) -> None:
        from rich.text import Text

        line = Text.assemble(_text(f"{f.id} {f.name} ({f.severity.value})", SEVERITY_STYLE[f.severity]), " ",
                             _text(f.message))
        self.con.print(line, soft_wrap=True)
        if chain and f.holder_chain:
            self.text("  held by: " + f.render_chain())

    def result(self, payload: Mapping[str, Any]) -> None:
        """The console shows the blocks, not the machine-readable document."""

    def close(self) -> None:
        """Nothing is buffered."""
