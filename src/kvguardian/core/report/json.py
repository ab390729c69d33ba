"""The JSON reporter: the command's result document, written when the reporter closes.

Text, tables and live lines are for people and are left out; the document is `Reporter.result`'s payload
(or, when a command gave none, the report of its findings). Output is valid JSON in every case: UTF-8 kept
readable, control and bidi characters as ``\\uXXXX`` escapes, NaN and infinities as ``null``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from kvguardian.core.findings import Finding, Report
from kvguardian.core.report.escape import dumps
from kvguardian.core.report.reporter import Tone

__all__ = ["JsonReporter"]


class JsonReporter:
    """`kvguardian.core.report.reporter.Reporter` writing one JSON document (stdout unless a stream is given)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream
        self.payload: Mapping[str, Any] | None = None
        self._report: Report | None = None

    def heading(self, text: str) -> None:
        """Headings are for people."""

    def text(self, line: str, *, tone: Tone = "plain") -> None:
        """Prose is for people."""

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        """Tables are views of the result, which carries the data."""

    def findings(self, report: Report, *, per_group: int | None = None, limit: int = 50,
                 more: str = "the JSON report") -> None:
        self._report = report

    def finding(self, finding: Finding) -> None:
        """Live lines are for people; the result lists every finding."""

    def result(self, payload: Mapping[str, Any]) -> None:
        self.payload = payload

    def close(self) -> None:
        payload = self.payload
        if payload is None and self._report is not None:
            payload = self._report.to_dict()
        if payload is None:
            return
        out = self.stream if self.stream is not None else sys.stdout
        out.write(dumps(payload) + "\n")
        out.flush()
