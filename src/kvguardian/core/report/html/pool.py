"""Paged-pool reports: blocks by state as one stacked bar per pool, and the first bad operation the debug
checks caught (which request, which block, which operation).

A pool's metrics (`kvguardian.runtime.paged.metrics.pool_metrics`) and its first fault appear wherever a report
carries them - a reproduction's measurements name each pool variant; they are found by their keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvguardian.core.report.html.markup import el, num, text, truncate

__all__ = ["find_pools", "render_pools"]

_STATES = (("blocks_referenced", "referenced"), ("blocks_cached", "cached (prefix)"), ("blocks_free", "free"))
_MAX_POOLS = 24


def _is_metrics(d: Mapping[str, Any]) -> bool:
    return all(isinstance(d.get(k), int) for k in ("blocks_total", "blocks_free", "blocks_cached", "blocks_referenced"))


def find_pools(data: object, path: str = "", depth: int = 0) -> list[tuple[str, Mapping[str, Any], Any]]:
    """(where, metrics, first fault or None) for every pool-metrics object inside ``data``."""
    out: list[tuple[str, Mapping[str, Any], Any]] = []
    if depth > 8 or len(out) > _MAX_POOLS:
        return out
    if isinstance(data, Mapping):
        m = data.get("metrics")
        if isinstance(m, Mapping) and _is_metrics(m):
            out.append((path.strip(".") or "pool", m, data.get("first_fault")))
        elif _is_metrics(data):
            out.append((path.strip(".") or "pool", data, None))
        for k, v in data.items():
            if k != "metrics":
                out.extend(find_pools(v, f"{path}.{k}", depth + 1))
    elif isinstance(data, list):
        for i, v in enumerate(data[:200]):
            out.extend(find_pools(v, f"{path}[{i}]", depth + 1))
    return out[:_MAX_POOLS]


def _bar(where: str, m: Mapping[str, Any], row: int) -> str:
    total = max(1, int(m["blocks_total"]))
    w, left, h = 960.0, 260.0, 22.0
    y = 4 + row * (h + 6)
    x = left
    parts = [el("text", text(truncate(where, 40)), x=num(left - 8), y=num(y + 15), class_="tick", text_anchor="end")]
    orphaned = int(m.get("blocks_orphaned", 0) or 0)
    for key, label in _STATES:
        n = int(m[key])
        if key == "blocks_referenced" and orphaned:
            n -= orphaned
            bw = (w - left - 10) * orphaned / total
            parts.append(el("rect", el("title", text(f"{where}: {orphaned} referenced blocks no live table lists "
                                                     "(lost frees)")), x=num(x), y=num(y), width=num(bw),
                            height=num(h), class_="blk blk-orphaned"))
            x += bw
        bw = (w - left - 10) * n / total
        parts.append(el("rect", el("title", text(f"{where}: {n} of {total} blocks {label}")), x=num(x), y=num(y),
                        width=num(bw), height=num(h), class_=f"blk blk-{key.split('_')[1]}"))
        x += bw
    return el("g", "".join(parts), class_="pool", data_blocks=total)


def _fault(where: str, f: object) -> str:
    if not isinstance(f, Mapping):
        return ""
    what = ", ".join(f"{k} {f[k]}" for k in ("operation", "op_seq", "request_id", "tenant", "block", "layer")
                     if f.get(k) is not None)
    return el("li", el("strong", text(where)) + ": " + el("span", text(f"{f.get('id')} {f.get('name', '')}"),
                                                           class_="fid") + " " + text(f"at {what}")
              + el("p", text(f.get("message", "")), class_="msg"), class_="fault")


def render_pools(data: object, chart_id: str) -> str:
    pools = find_pools(data)
    if not pools:
        return ""
    bars = "".join(_bar(w, m, i) for i, (w, m, _) in enumerate(pools))
    h = 8 + len(pools) * 28
    svg = el("svg", el("title", "Blocks of each paged pool by state", id=f"{chart_id}-title") + bars, id=chart_id,
             class_="chart pools", role="img", aria_labelledby=f"{chart_id}-title", viewBox=f"0 0 960 {h}", width=960,
             height=h)
    legend = el("ul", "".join(el("li", el("span", "", class_=f"swatch blk-{k}", aria_hidden="true") + text(label))
                              for k, label in (("orphaned", "referenced, no live table (lost free)"),
                                               ("referenced", "referenced"), ("cached", "cached (prefix)"),
                                               ("free", "free"))), class_="legend")
    faults = "".join(_fault(w, f) for w, _, f in pools)
    first = el("h3", "First bad operation") + el("ul", faults, class_="faults") if faults else ""
    return el("figure", el("div", svg, class_="scroll chart-box") + el("figcaption", legend), class_="pools-figure",
              data_pools=len(pools)) + first
