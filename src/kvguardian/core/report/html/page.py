"""The page: one self-contained HTML file with a verdict header, the sections a report kind has, and a
Content-Security-Policy that forbids every network request.

The policy is ``default-src 'none'``: no script, style, image, font, frame or connection is allowed except the
one inline style sheet and the one inline script, each allowed by its SHA-256 hash. Nothing is loaded from
anywhere, so the report opens offline and cannot call home; every chart is SVG drawn in the file and every
collapsible part a ``<details>``, so the page is complete with JavaScript disabled (the script only adds zoom and
tooltips).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import Sequence
from functools import cache
from importlib import resources

from kvguardian.core.errors import UsageError
from kvguardian.core.report.document import Audit, Document, tool_version
from kvguardian.core.report.history import read_history
from kvguardian.core.report.html.findings import counts, render_counts, render_findings
from kvguardian.core.report.html.heatmap import render_heatmap
from kvguardian.core.report.html.holders import render_tree
from kvguardian.core.report.html.keyspace import render_diff, render_patterns, render_treemap
from kvguardian.core.report.html.lanes import render_lanes
from kvguardian.core.report.html.markup import el, text
from kvguardian.core.report.html.measurements import render_value
from kvguardian.core.report.html.pool import render_pools
from kvguardian.core.report.html.timeline import render_timeline

__all__ = ["CSP", "render_page"]

MAX_AUDIT_SECTIONS = 12  # audits (processes, tests) drawn with charts; the rest are listed


@cache
def _asset(name: str) -> str:
    return resources.files("kvguardian.core.report.html").joinpath(name).read_text(encoding="utf-8")


def _sha256(body: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode("ascii")


def csp(style: str, script: str) -> str:
    """The page's policy: nothing from anywhere; only the page's own style sheet and script."""
    return (f"default-src 'none'; style-src '{_sha256(style)}'; script-src '{_sha256(script)}'; img-src 'none'; "
            "font-src 'none'; connect-src 'none'; media-src 'none'; object-src 'none'; frame-src 'none'; "
            "worker-src 'none'; manifest-src 'none'; base-uri 'none'; form-action 'none'")


CSP = csp  # the policy for given assets (tests check a page's meta tag against it)


def _iso(t: float | None) -> str:
    if t is None:
        return "unknown"
    try:
        return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "unknown"


def _verdict(doc: Document) -> str:
    c = counts(doc.findings)
    worst = next((s for s in ("error", "warning", "info") if c[s]), None)
    if worst is None:
        line = "✓ No findings"
    else:
        line = f"✗ {len(doc.findings)} finding(s): " + ", ".join(f"{c[s]} {s}" for s in ("error", "warning", "info")
                                                                  if c[s])
    facts = [("when", _iso(doc.created)), *doc.facts, ("file", doc.source)]
    dl = el("dl", "".join(el("dt", text(k)) + el("dd", text(v)) for k, v in facts), class_="facts")
    notes = el("ul", "".join(el("li", text(n)) for n in doc.notes), class_="notes") if doc.notes else ""
    return el("header", el("h1", text(doc.title)) + el("p", text(line), class_="verdict-line")
              + render_counts(doc.findings) + dl + notes, class_=f"verdict worst-{worst or 'none'}", data_kind=doc.kind)


def _section(sid: str, title: str, body: str) -> str:
    return el("section", el("h2", text(title), id=f"{sid}-h") + body, id=sid, aria_labelledby=f"{sid}-h")


def _audit(i: int, audit: Audit) -> str:
    sid = f"audit{i}"
    tl = audit.timeline
    parts = []
    if tl is None:
        parts.append(el("p", "This audit has no KV timeline (a report from a kv-guardian without one, or nothing "
                             "was sampled).", class_="none"))
    else:
        try:
            hist = read_history(tl)
        except UsageError as exc:
            parts.append(el("p", text(f"The KV timeline of this audit is damaged and is not drawn ({exc}); the "
                                      "findings below are complete."), class_="none"))
        else:
            parts.append(el("h3", "KV timeline") + render_timeline(hist, audit.findings, f"{sid}-timeline"))
            parts.append(el("h3", "Per-request lanes") + render_lanes(hist, f"{sid}-lanes"))
            parts.append(el("h3", "Layer × request: KV alive after its owner ended")
                         + render_heatmap(hist, f"{sid}-heatmap"))
    summary = {k: v for k, v in audit.summary.items() if k != "timeline"}
    if summary:
        parts.append(el("details", el("summary", "Ledger summary") + render_value(summary), class_="summary"))
    return el("section", el("h2", text(f"KV audit: {audit.label}"), id=f"{sid}-h") + "".join(parts), id=sid,
              class_="audit", aria_labelledby=f"{sid}-h", data_audit=audit.label[:200])


def _audit_list(audits: Sequence[Audit]) -> str:
    head = el("tr", "".join(el("th", h, scope="col") for h in ("audit", "findings", "requests", "KV alive (bytes)")))
    rows = "".join(el("tr", el("td", text(a.label)) + el("td", str(len(a.findings)))
                      + el("td", text(a.summary.get("requests_seen", "")))
                      + el("td", text(a.summary.get("total_bytes", "")))) for a in audits[:2000])
    more = el("p", text(f"… {len(audits) - 2000} more"), class_="more") if len(audits) > 2000 else ""
    return el("div", el("table", el("thead", head) + el("tbody", rows), class_="rows"), class_="scroll",
              tabindex="0") + more


def _kv_sections(doc: Document) -> list[tuple[str, str, str]]:
    out = []
    audits = doc.audits
    if len(audits) > 1:
        out.append(("audits", f"Audits ({len(audits)})", _audit_list(audits)))
    drawn = sorted(range(len(audits)), key=lambda i: (-len(audits[i].findings), i))[:MAX_AUDIT_SECTIONS]
    for i in sorted(drawn):
        out.append((f"audit{i}", "", _audit(i, audits[i])))
    return out


def _sections(doc: Document) -> list[tuple[str, str, str]]:
    """(id, heading, body) of each section in page order; a heading of "" means the body is a whole section
    already (an audit). Pictures first, then the holder tree, then every finding in full."""
    data = doc.data
    out: list[tuple[str, str, str]] = []
    if doc.kind == "redis-scan":
        patterns = list(data.get("patterns") or [])
        out.append(("treemap", "Key patterns by bytes", render_treemap(patterns, "treemap")))
        out.append(("patterns", "TTL and idle time per pattern", render_patterns(patterns, "pat")))
    elif doc.kind == "redis-diff":
        out.append(("growth", "Growth per pattern", render_diff(list(data.get("rows") or []), "growth")))
    if doc.kind in ("guard", "report", "run", "pytest"):
        out.extend(_kv_sections(doc))
    pools = render_pools(data, "pools")
    if pools:
        out.append(("pools", "Paged pools", pools))
    tree = render_tree(doc.findings)
    if tree:
        out.append(("holders", "Holder chains", tree))
    out.append(("findings", "Findings", render_findings(doc.findings)))
    warnings = data.get("warnings")
    if isinstance(warnings, list) and warnings:
        out.append(("warnings", "Warnings", el("ul", "".join(el("li", text(w)) for w in warnings[:200]))))
    if doc.kind in ("watch", "repro"):
        rest = data.get("summary") if doc.kind == "watch" else data
        out.append(("details", "Measurements" if doc.kind == "repro" else "Watch summary", render_value(rest)))
    return out


def render_page(doc: Document, *, output: str = "") -> str:
    """The whole HTML file of ``doc``; ``output`` (markup) is what the command printed for people, shown last."""
    style, script = _asset("page.css"), _asset("page.js")
    sections = _sections(doc)
    if output:
        sections.append(("output", "Command output", el("div", output, class_="output")))
    body = []
    toc = []
    for sid, title, content in sections:
        if title:
            body.append(_section(sid, title, content))
        else:
            body.append(content)
        toc.append(el("li", el("a", text(title or "KV audit"), href=f"#{sid}")))
    nav = el("nav", el("ul", "".join(toc)), class_="toc", aria_label="sections")
    version = tool_version()
    footer = el("footer", text(f"Rendered by kv-guardian {version} from {doc.source}. Self-contained: no network "
                               "request is made or allowed (Content-Security-Policy); charts are SVG and work without "
                               "JavaScript."))
    head = ("<meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{text(csp(style, script))}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<meta name=\"referrer\" content=\"no-referrer\">"
            f"<title>{text(doc.title)}</title><style>{style}</style>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head>" + head + "</head><body>" + _verdict(doc) + nav
            + el("main", "".join(body)) + footer + f"<script>{script}</script></body></html>\n")
