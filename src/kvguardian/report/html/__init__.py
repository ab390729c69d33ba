"""The self-contained HTML report: a pure function of a report's JSON (`render_html`), one module per part.
Which kind of report a file is, and whether it can be read, is `kvguardian.report.document`.

==============  ===========================================================================================
``page``        the page shell: verdict header, sections, the Content-Security-Policy, the inline assets
``findings``    findings with evidence, holder chain and fix, grouped
``holders``     holder chains as a tree grouped by shared root and path, with counts
``timeline``    KV bytes by state over time, request marks, the KVG103 trend line
``lanes``       per-request lanes (start, end, what outlived the end)
``heatmap``     layer × request bytes alive after the owner ended
``keyspace``    Redis: treemap of patterns, TTL/idle per pattern, growth between scans
``treemap``     the squarified treemap layout
``pool``        paged pools: blocks by state, the first bad operation
``measurements``  any other JSON (a reproduction's measurements) as lists and tables
``chart``, ``axes``, ``decimate``, ``markup``: the chart frame, ticks and units, bounded views, escaping
==============  ===========================================================================================

Charts are hand-written SVG (no plotting package): see the module docs of `chart` and the README's "HTML
report" section for why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvguardian.report.document import Document, classify, load_document, parse_document
from kvguardian.report.html.page import render_page

__all__ = ["Document", "classify", "load_document", "parse_document", "render_html", "write_html"]


def render_html(data: Any, *, source: str = "report") -> str:
    """The HTML report of parsed report JSON ``data`` (any kind kv-guardian writes)."""
    return render_page(classify(data, source=source, where=f"report {source!r}"))


def write_html(doc: Document, path: str | Path) -> int:
    """Write ``doc``'s page to ``path``; returns the bytes written."""
    body = render_page(doc).encode("utf-8")
    Path(path).write_bytes(body)
    return len(body)
