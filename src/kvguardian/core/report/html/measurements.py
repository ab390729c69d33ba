"""Any other JSON a report carries - a reproduction's measurements, a watch's counters, a ledger summary - as
nested definition lists and tables, bounded in depth, rows and characters."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kvguardian.core.report.html.markup import el, text, truncate

__all__ = ["render_value"]

_MAX_DEPTH = 5
_MAX_ITEMS = 80
_MAX_ROWS = 100
_MAX_COLS = 12


def _scalar(v: object) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _short(v: object) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
    return text(truncate(s, 300))


def _table(items: Sequence[Mapping[str, Any]]) -> str:
    cols: list[str] = []
    for it in items[:_MAX_ROWS]:
        for k, v in it.items():
            if k not in cols and _scalar(v) and len(cols) < _MAX_COLS:
                cols.append(k)
    head = el("tr", "".join(el("th", text(c), scope="col") for c in cols))
    body = "".join(el("tr", "".join(el("td", _short(it.get(c, ""))) for c in cols)) for it in items[:_MAX_ROWS])
    more = el("p", text(f"… {len(items) - _MAX_ROWS} more rows"), class_="more") if len(items) > _MAX_ROWS else ""
    return el("div", el("table", el("thead", head) + el("tbody", body), class_="rows"), class_="scroll") + more


def render_value(value: object, depth: int = 0) -> str:
    """``value`` as HTML: scalars as text, objects as ``<dl>`` (nested ones collapsible), lists of objects as
    tables, lists of scalars inline."""
    if _scalar(value):
        return _short(value)
    if depth >= _MAX_DEPTH:
        return _short(value)
    if isinstance(value, Mapping):
        rows = []
        for k, v in list(value.items())[:_MAX_ITEMS]:
            if _scalar(v) or (isinstance(v, list) and all(_scalar(x) for x in v) and len(v) <= 16):
                rows.append(el("dt", text(k)) + el("dd", _short(v)))
            else:
                rows.append(el("dt", text(k)) + el("dd", el("details", el("summary", text(f"{len(v)} item(s)"))
                                                            + render_value(v, depth + 1))))
        more = el("p", text(f"… {len(value) - _MAX_ITEMS} more"), class_="more") if len(value) > _MAX_ITEMS else ""
        return el("dl", "".join(rows), class_="kv") + more
    if isinstance(value, Sequence):
        if value and all(isinstance(x, Mapping) for x in value):
            return _table(value)
        if all(_scalar(x) for x in value):
            return _short(value)
        return el("ol", "".join(el("li", render_value(x, depth + 1)) for x in value[:_MAX_ITEMS]))
    return _short(str(value))
