"""The self-contained HTML report: a pure function of a report's JSON (`render_html`), one module per part.
Which kind of report a file is, and whether it can be read, is `kvguardian.core.report.document`.

``page`` is the shell; ``findings``, ``holders``, ``timeline``, ``lanes``, ``heatmap``, ``keyspace``, ``pool`` and
``measurements`` draw the sections; ``treemap``, ``chart``, ``axes``, ``decimate`` and ``markup`` are the helpers.
Charts are hand-written SVG (no plotting package; why: ``bench/html_plotting.py``). The module table:
docs/design/report.md.
"""

from __future__ import annotations

from pathlib import Path

from kvguardian.core.report.document import Document, classify, load_document, parse_document
from kvguardian.core.report.html.page import render_page

__all__ = ["Document", "classify", "load_document", "parse_document", "render_html", "write_html"]


def render_html(data: object, *, source: str = "report") -> str:
    """The HTML report of parsed report JSON ``data`` (any kind kv-guardian writes)."""
    return render_page(classify(data, source=source, where=f"report {source!r}"))


def write_html(doc: Document, path: str | Path) -> int:
    """Write ``doc``'s page to ``path``; returns the bytes written."""
    body = render_page(doc).encode("utf-8")
    Path(path).write_bytes(body)
    return len(body)
