"""The one reporter interface: every command's output goes through a `Reporter`.

A command describes its output as blocks (heading, text, tables, findings, the machine-readable result) and
the chosen reporter renders them: `FORMATS` holds ``console``, ``json`` and ``html``; `reporting(..., html=FILE)`
also writes the HTML page. Every argument is data, never markup (`kvguardian.core.report.escape`). How to add a
format: docs/design/report.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, Any, Literal, Protocol

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Finding, Report

__all__ = ["FORMATS", "Reporter", "Tee", "Tone", "make_reporter", "reporting"]

#: How a line of text is meant: plain prose, emphasised, a warning, or an error.
Tone = Literal["plain", "strong", "warning", "error"]

#: format name -> "module:class". Add a line here to add a format.
FORMATS: dict[str, str] = {
    "console": "kvguardian.core.report.console:ConsoleReporter",
    "json": "kvguardian.core.report.json:JsonReporter",
    "html": "kvguardian.core.report.html.reporter:HtmlReporter",
}


class Reporter(Protocol):
    """Where a command's output goes. Implementations escape every string they are given."""

    def heading(self, text: str) -> None:
        """The title of what follows (a command's first line, a section)."""

    def text(self, line: str, *, tone: Tone = "plain") -> None:
        """One line of prose; ``""`` is a blank line."""

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        """A table; cells are shown with ``str()``."""

    def findings(self, report: Report, *, per_group: int | None = None, limit: int = 50,
                 more: str = "the JSON report") -> None:
        """Findings worst first, each with its holder chain and fix, then the counts. With ``per_group``,
        findings sharing id, severity and holder root are shown ``per_group`` at a time and counted;
        ``more`` names where the rest can be read."""

    def finding(self, finding: Finding) -> None:
        """One finding's first line, as it appears (live output of a long-running command)."""

    def result(self, payload: Mapping[str, Any]) -> None:
        """The machine-readable result of the command (what ``--json`` prints)."""

    def close(self) -> None:
        """Finish the output (a buffering format writes it now)."""


class Tee:
    """A `Reporter` that hands every call to each of ``reporters`` (the terminal and an HTML file, say)."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def heading(self, text: str) -> None:
        for r in self.reporters:
            r.heading(text)

    def text(self, line: str, *, tone: Tone = "plain") -> None:
        for r in self.reporters:
            r.text(line, tone=tone)

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        kept = [list(row) for row in rows]  # an iterator is read once, by the first reporter
        for r in self.reporters:
            r.table(title, columns, kept)

    def findings(self, report: Report, *, per_group: int | None = None, limit: int = 50,
                 more: str = "the JSON report") -> None:
        for r in self.reporters:
            r.findings(report, per_group=per_group, limit=limit, more=more)

    def finding(self, finding: Finding) -> None:
        for r in self.reporters:
            r.finding(finding)

    def result(self, payload: Mapping[str, Any]) -> None:
        for r in self.reporters:
            r.result(payload)

    def close(self) -> None:
        """Close every reporter, the later ones even when an earlier one fails."""
        try:
            for r in self.reporters[:-1]:
                r.close()
        finally:
            self.reporters[-1].close()


def _format(fmt: str) -> Any:
    """The reporter class of format ``fmt`` (imported by name from `FORMATS`).

    Raises:
        UsageError: ``fmt`` is not a key of `FORMATS`.
    """
    target = FORMATS.get(fmt)
    if target is None:
        raise UsageError(f"unknown output format {fmt!r}; use one of: {', '.join(FORMATS)}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def make_reporter(fmt: str = "console", stream: IO[str] | None = None, *, html: str | None = None) -> Reporter:
    """A reporter of format ``fmt`` writing to ``stream`` (stdout by default); with ``html``, a `Tee` that also
    writes the HTML page to that file when it closes.

    Raises:
        UsageError: ``fmt`` is not a key of `FORMATS`.
    """
    reporter: Reporter = _format(fmt)(stream)
    if html:
        page: Reporter = _format("html")(path=html)
        return Tee(reporter, page)
    return reporter


@contextmanager
def reporting(fmt: str = "console", stream: IO[str] | None = None, *, html: str | None = None) -> Iterator[Reporter]:
    """`make_reporter` as a context: the reporter is closed (its output written) when the block ends."""
    reporter = make_reporter(fmt, stream, html=html)
    try:
        yield reporter
    finally:
        reporter.close()
