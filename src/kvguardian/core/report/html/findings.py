"""The findings of a report, worst first, each with its evidence, holder chain and fix.

Findings that share id, severity and holder root are one group (as on the terminal). A group shows its first
findings in full and the rest as rows of a table, so a report with 100,000 findings stays small; the counts
in the header are always of every finding.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kvguardian.core.report.document import FindingView
from kvguardian.core.report.html.markup import el, text, truncate

__all__ = ["SEVERITIES", "render_counts", "render_findings"]

SEVERITIES = ("error", "warning", "info")
_RANK = {"error": 0, "warning": 1, "info": 2}
_FULL_PER_GROUP = 5  # findings drawn in full per group
_ROWS_PER_GROUP = 200  # then this many as table rows
_EVIDENCE_VALUE = 400  # characters of one evidence value


def counts(findings: Sequence[FindingView]) -> dict[str, int]:
    out = dict.fromkeys(SEVERITIES, 0)
    for f in findings:
        out[f.severity] = out.get(f.severity, 0) + 1
    return out


def render_counts(findings: Sequence[FindingView]) -> str:
    """``3 error · 1 warning · 0 info`` with each number in ``data-count`` (the verdict header)."""
    c = counts(findings)
    items = "".join(el("li", el("span", str(c[s]), class_="n") + " " + s, class_=f"sev sev-{s}", data_severity=s,
                       data_count=c[s]) for s in SEVERITIES)
    return el("ul", items, class_="counts", data_total=len(findings), aria_label="findings by severity")


def _value(v: object) -> str:
    if isinstance(v, (str, int, float, bool)) or v is None:
        s = str(v)
    else:
        s = json.dumps(v, default=str, ensure_ascii=False, sort_keys=True)
    return text(truncate(s, _EVIDENCE_VALUE))


def _evidence(ev: Mapping[str, Any]) -> str:
    if not ev:
        return ""
    rows = "".join(el("dt", text(k)) + el("dd", _value(v)) for k, v in list(ev.items())[:60])
    return el("details", el("summary", "evidence") + el("dl", rows), class_="evidence")


def _chain(chain: Sequence[str]) -> str:
    if not chain:
        return ""
    steps = "".join(el("li", text(s)) for s in chain)
    return el("div", el("span", "held by", class_="label") + el("ol", steps, class_="chain"), class_="held")


def _full(f: FindingView) -> str:
    head = (el("span", text(f.id), class_="fid") + " " + el("span", text(f.name), class_="fname") + " "
            + el("span", text(f.severity), class_=f"badge sev-{f.severity}"))
    parts = [el("h3", head, class_="fhead"), el("p", text(f.message), class_="msg")]
    if f.origin:
        parts.append(el("p", "in " + text(f.origin), class_="origin"))
    parts.append(_chain(f.holder_chain))
    parts.append(_evidence(f.evidence))
    if f.fix:
        parts.append(el("p", el("strong", "Fix:") + " " + text(f.fix), class_="fix"))
    return el("article", "".join(parts), class_=f"finding sev-{f.severity}", data_id=f.id, data_severity=f.severity)


def _rows(items: Sequence[FindingView]) -> str:
    body = "".join(
        el("tr", el("td", text(f.origin or "")) + el("td", text(f.evidence.get("request_id", "")))
           + el("td", text(f.evidence.get("bytes", ""))) + el("td", text(truncate(f.message, 200))))
        for f in items[:_ROWS_PER_GROUP]
    )
    head = el("tr", "".join(el("th", h, scope="col") for h in ("where", "request", "bytes", "message")))
    more = ""
    if len(items) > _ROWS_PER_GROUP:
        more = el("p", text(f"… and {len(items) - _ROWS_PER_GROUP} more in the JSON report"), class_="more")
    return el("div", el("table", el("thead", head) + el("tbody", body), class_="rows"), class_="scroll") + more


def _groups(findings: Sequence[FindingView]) -> list[list[FindingView]]:
    groups: dict[tuple[str, str, str], list[FindingView]] = {}
    for f in sorted(findings, key=lambda f: _RANK.get(f.severity, 3)):
        root = f.holder_chain[0] if f.holder_chain else ""
        groups.setdefault((f.severity, f.id, root), []).append(f)
    return list(groups.values())


def render_findings(findings: Sequence[FindingView]) -> str:
    """Every finding, grouped; an explicit 'no findings' paragraph when there are none."""
    if not findings:
        return el("p", "No findings: nothing at any severity.", class_="none", data_findings="0")
    out = []
    for i, items in enumerate(_groups(findings)):
        first = items[0]
        root = f" · held under {truncate(first.holder_chain[0], 120)}" if first.holder_chain else ""
        summary = el("summary", el("span", text(first.id), class_="fid") + " " + text(first.name) + " "
                     + el("span", text(first.severity), class_=f"badge sev-{first.severity}")
                     + text(f" ×{len(items)}{root}"))
        body = "".join(_full(f) for f in items[:_FULL_PER_GROUP])
        if len(items) > _FULL_PER_GROUP:
            body += el("h3", text(f"{len(items) - _FULL_PER_GROUP} more like these"), class_="sub") \
                + _rows(items[_FULL_PER_GROUP:])
        out.append(el("details", summary + body, class_="group", open=i < 8, data_id=first.id,
                      data_severity=first.severity, data_count=len(items)))
    return el("div", "".join(out), class_="findings", data_findings=len(findings))
