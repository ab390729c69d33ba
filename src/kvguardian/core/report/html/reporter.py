"""The HTML reporter: `kvguardian.core.report.reporter.Reporter` writing one self-contained page when it closes.

A command's result document (what ``--json`` prints) decides the page: a report kv-guardian knows is drawn as
``kv-guardian report`` draws it (`kvguardian.core.report.html.page`); the headings, lines and tables the command
printed for people follow in a "Command output" section. A command that gave no result gets a page of the
findings it reported. Every string is data: it goes through `markup.text`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Finding, Report
from kvguardian.core.report.document import classify
from kvguardian.core.report.html.markup import el, text, truncate
from kvguardian.core.report.html.page import render_page
from kvguardian.core.report.reporter import Tone

__all__ = ["HtmlReporter", "html_file"]

_MAX_BLOCKS = 2_000
_MAX_ROWS = 1_000
_MAX_LIVE = 10_000


class HtmlReporter:
    """Buffers a command's output and writes the page at `close` (to ``stream``, stdout by default)."""

    def __init__(self, stream: IO[str] | None = None, *, source: str = "command output",
                 path: str | os.PathLike[str] | None = None) -> None:
        self.stream = stream
        self.source = Path(path).name if path is not None and source == "command output" else source
        self.path = path  # write the page to this file (whole, or not at all) instead of a stream
        self.blocks: list[str] = []
        self.dropped = 0
        self.payload: Mapping[str, Any] | None = None
        self.report: Report | None = None
        self.live: list[Finding] = []

    def _add(self, block: str) -> None:
        if len(self.blocks) < _MAX_BLOCKS:
            self.blocks.append(block)
        else:
            self.dropped += 1

    def heading(self, text_: str) -> None:
        self._add(el("h3", text(text_)))

    def text(self, line: str, *, tone: Tone = "plain") -> None:
        self._add(el("p", text(line), class_=f"out tone-{tone}") if line else "")

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        head = el("tr", "".join(el("th", text(c), scope="col") for c in columns))
        body = []
        extra = 0
        for i, row in enumerate(rows):
            if i >= _MAX_ROWS:
                extra += 1
                continue
            body.append(el("tr", "".join(el("td", text(truncate(c, 400))) for c in row)))
        more = el("p", text(f"… {extra} more rows"), class_="more") if extra else ""
        caption = el("caption", text(title)) if title else ""
        self._add(el("div", el("table", caption + el("thead", head) + el("tbody", "".join(body)), class_="rows"),
                     class_="scroll", tabindex="0") + more)

    def findings(self, report: Report, *, per_group: int | None = None, limit: int = 50,
                 more: str = "the JSON report") -> None:
        self.report = report

    def finding(self, finding: Finding) -> None:
        if len(self.live) < _MAX_LIVE:
            self.live.append(finding)

    def result(self, payload: Mapping[str, Any]) -> None:
        self.payload = payload

    def page(self) -> str:
        """The page as it stands (what `close` writes)."""
        data: Any = self.payload
        if data is None:
            report = self.report if self.report is not None else Report(findings=list(self.live))
            data = report.to_dict()
        try:
            doc = classify(data, source=self.source, where=self.source)
        except UsageError:  # a result that is no report kind (a table of measurements): the findings, then it
            report = self.report if self.report is not None else Report(findings=list(self.live))
            doc = classify(report.to_dict(), source=self.source, where=self.source)
        output = "".join(self.blocks)
        if self.dropped:
            output += el("p", text(f"… {self.dropped} more blocks of output"), class_="more")
        return render_page(doc, output=output)

    def close(self) -> None:
        """Write the page (to a file: whole, see `write_whole`). Raises `UsageError` when the file cannot be
        written (the command's other output is done)."""
        page = self.page()
        if self.path is None:
            out = self.stream if self.stream is not None else sys.stdout
            out.write(page)
            out.flush()
            return
        from kvguardian.core.report.output import write_whole

        try:
            write_whole(self.path, page)
        except OSError as exc:
            raise UsageError(f"cannot write --html {str(self.path)!r}: {exc.strerror or exc}") from None


def html_file(path: str | os.PathLike[str]) -> HtmlReporter:
    """An `HtmlReporter` that writes its page to ``path`` when it closes (``--html FILE``)."""
    return HtmlReporter(path=path)
