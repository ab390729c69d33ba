"""Redis: a treemap of key patterns by bytes coloured by their share of keys without a TTL, each pattern's TTL
histogram and idle times, and for a diff the growth of each pattern.

A scan keeps, per pattern, a TTL histogram in fixed buckets, an idle-time histogram (``idle_buckets``, the same
ranges) and idle-time quantiles (p50, p90, max). Scans written before ``idle_buckets`` existed get the three
quantiles drawn as marks on a log time axis; under an LFU policy there are access counters, not idle times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvguardian.core.report.html.axes import human_bytes, human_duration
from kvguardian.core.report.html.markup import el, num, text, truncate
from kvguardian.core.report.html.treemap import squarify

__all__ = ["render_diff", "render_patterns", "render_treemap"]

MAX_TILES = 200
MAX_PANELS = 30
MAX_GROWTH_ROWS = 40
TTL_ORDER = ("none", "lt_1m", "lt_10m", "lt_1h", "lt_1d", "lt_7d", "lt_30d", "ge_30d")
IDLE_ORDER = ("lt_1m", "lt_10m", "lt_1h", "lt_1d", "lt_7d", "lt_30d", "ge_30d")
TTL_LABELS = {"none": "no TTL", "lt_1m": "< 1 min", "lt_10m": "< 10 min", "lt_1h": "< 1 h", "lt_1d": "< 1 d",
              "lt_7d": "< 7 d", "lt_30d": "< 30 d", "ge_30d": "≥ 30 d"}


def _int(v: object) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0


def _share_class(p: Mapping[str, Any]) -> tuple[int, float]:
    keys = _int(p.get("keys"))
    share = _int(p.get("no_ttl_keys")) / keys if keys else 0.0
    return min(5, int(share * 5)), share


def render_treemap(patterns: Sequence[Mapping[str, Any]], chart_id: str) -> str:
    tiles = sorted((p for p in patterns if _int(p.get("bytes")) > 0), key=lambda p: -_int(p.get("bytes")))
    if not tiles:
        return el("p", "No key holds any bytes.", class_="none", data_tiles="0")
    shown = tiles[:MAX_TILES]
    rest = tiles[MAX_TILES:]
    values = [float(_int(p.get("bytes"))) for p in shown]
    if rest:
        values.append(float(sum(_int(p.get("bytes")) for p in rest)))
    w, h = 960.0, 420.0
    rects = squarify(values, 0.0, 0.0, w, h)
    out = []
    for p, (x, y, rw, rh) in zip([*shown, None] if rest else shown, rects):
        if p is None:
            title = f"{len(rest)} smaller patterns: {human_bytes(values[-1])}"
            label, klass = f"+{len(rest)} more", "nt-other"
        else:
            k, share = _share_class(p)
            title = (f"{p['pattern']} · {human_bytes(_int(p.get('bytes')))} in {_int(p.get('keys')):,} keys · "
                     f"{share:.0%} of keys without a TTL · {_int(p.get('cold_keys')):,} cold")
            label, klass = str(p["pattern"]), f"nt{k}"
        body = el("title", text(title)) + el("rect", "", x=num(x), y=num(y), width=num(max(0.0, rw - 1)),
                                             height=num(max(0.0, rh - 1)), class_=f"tile {klass}")
        if rw > 60 and rh > 16:
            body += el("text", text(truncate(label, max(4, int(rw / 7)))), x=num(x + 4), y=num(y + 13),
                       class_="tile-label")
        out.append(el("g", body, class_="tile-g", data_pattern=truncate(label, 200)))
    svg = el("svg", el("title", "Key patterns by bytes", id=f"{chart_id}-title")
             + el("desc", text(f"{len(tiles)} pattern(s), coloured by the share of their keys without a TTL."),
                  id=f"{chart_id}-desc") + "".join(out),
             id=chart_id, class_="chart treemap", role="img", aria_labelledby=f"{chart_id}-title {chart_id}-desc",
             viewBox=f"0 0 {num(w)} {num(h)}", width=num(w), height=num(h))
    legend = el("ul", "".join(el("li", el("span", "", class_=f"swatch nt{k}", aria_hidden="true") + text(label))
                              for k, label in enumerate(("0–20 % no TTL", "20–40 %", "40–60 %", "60–80 %",
                                                         "80–100 %", "all keys without a TTL"))), class_="legend")
    return el("figure", el("div", svg, class_="scroll chart-box") + el("figcaption", legend), class_="treemap-figure",
              data_tiles=len(out))


def _bars(title: str, labels: Sequence[str], counts: Sequence[int], klass: str, chart_id: str) -> str:
    w, h, left, bottom = 360.0, 120.0, 8.0, 30.0
    top = max(counts, default=0) or 1
    bw = (w - 2 * left) / max(1, len(counts))
    out = []
    for i, (lab, c) in enumerate(zip(labels, counts)):
        bh = (h - bottom - 8) * c / top
        x = left + i * bw
        out.append(el("g", el("title", text(f"{lab}: {c:,} key(s)"))
                      + el("rect", "", x=num(x + 1), y=num(h - bottom - bh), width=num(bw - 2), height=num(bh),
                           class_=f"bar {klass}{' bar-none' if lab == TTL_LABELS['none'] else ''}")
                      + el("text", text(lab), x=num(x + bw / 2), y=num(h - bottom + 12), class_="tick small",
                           text_anchor="middle"),
                      class_="bin", data_count=c))
    caption = el("text", text(title.split(" of the keys of ")[0]), x=num(left), y=10, class_="tick small")
    return el("svg", el("title", text(title), id=f"{chart_id}-title") + caption + "".join(out), id=chart_id,
              class_="chart mini", role="img", aria_labelledby=f"{chart_id}-title", viewBox=f"0 0 {num(w)} {num(h)}",
              width=num(w), height=num(h))


def _idle(p: Mapping[str, Any], chart_id: str) -> str:
    hist = p.get("idle_buckets")
    if isinstance(hist, Mapping):
        return _bars(f"idle time since the last read of the keys of {p['pattern']}",
                     [TTL_LABELS[k] for k in IDLE_ORDER], [_int(hist.get(k)) for k in IDLE_ORDER], "idle",
                     chart_id)
    q = p.get("idle_s")
    if not isinstance(q, Mapping):
        f = p.get("lfu_freq")
        if isinstance(f, Mapping):
            return el("p", text(f"LFU counter p50 {f.get('p50')}, p90 {f.get('p90')}, max {f.get('max')} (the server "
                                "runs an LFU policy: it keeps access counters, not idle times)"), class_="note")
        return ""
    marks: list[tuple[str, float]] = []
    for k in ("p50", "p90", "max"):
        v = q.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            marks.append((k, float(v)))
    if not marks:
        return ""
    w, h, left, right = 360.0, 64.0, 12.0, 12.0
    lo, hi = 1.0, max(86400.0 * 30, max(v for _, v in marks) * 1.5)

    def x(v: float) -> float:
        return left + (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (w - left - right)

    axis = [el("line", "", x1=num(left), x2=num(w - right), y1=30, y2=30, class_="axis")]
    for v, lab in ((1, "1 s"), (60, "1 min"), (3600, "1 h"), (86400, "1 d"), (86400 * 30, "30 d")):
        if v <= hi:
            axis.append(el("text", lab, x=num(x(v)), y=48, class_="tick small", text_anchor="middle"))
    dots = [el("g", el("title", text(f"idle {k}: {human_duration(v)}"))
               + el("circle", "", cx=num(x(v)), cy=30, r=5, class_=f"q q-{k}")
               + el("text", text(k), x=num(x(v)), y=18, class_="tick small", text_anchor="middle"), class_="quantile")
            for k, v in marks]
    return el("svg", el("title", text("idle time since the last read: p50, p90, max"), id=f"{chart_id}-title")
              + "".join(axis) + "".join(dots), id=chart_id, class_="chart mini", role="img",
              aria_labelledby=f"{chart_id}-title", viewBox=f"0 0 {num(w)} {num(h)}", width=num(w), height=num(h))


def _top_keys(p: Mapping[str, Any]) -> str:
    keys = p.get("top_keys")
    if not isinstance(keys, list) or not keys:
        return ""
    rows = "".join(el("tr", el("td", text(truncate(k.get("key"), 120))) + el("td", text(k.get("type")))
                      + el("td", text(human_bytes(_int(k.get("bytes")))))
                      + el("td", text("none" if k.get("ttl_ms") is None else human_duration(_int(k["ttl_ms"]) / 1000))))
                   for k in keys[:10] if isinstance(k, Mapping))
    head = el("tr", "".join(el("th", t, scope="col") for t in ("largest keys", "type", "bytes", "TTL")))
    return el("div", el("table", el("thead", head) + el("tbody", rows), class_="rows"), class_="scroll")


def render_patterns(patterns: Sequence[Mapping[str, Any]], chart_id: str) -> str:
    """A panel per pattern (largest first): TTL histogram, idle times, largest keys."""
    ordered = sorted(patterns, key=lambda p: -_int(p.get("bytes")))
    panels = []
    for i, p in enumerate(ordered[:MAX_PANELS]):
        ttl_value = p.get("ttl")
        ttl: Mapping[str, Any] = ttl_value if isinstance(ttl_value, Mapping) else {}
        counts = [_int(ttl.get(k)) for k in TTL_ORDER]
        _, share = _share_class(p)
        summary = el("summary", el("code", text(truncate(p["pattern"], 160))) + " "
                     + text(f"{human_bytes(_int(p.get('bytes')))} · {_int(p.get('keys')):,} keys · "
                            f"{share:.0%} without a TTL"))
        body = el("div", _bars(f"TTL of the keys of {p['pattern']}", [TTL_LABELS[t] for t in TTL_ORDER], counts,
                               "ttl", f"{chart_id}-ttl{i}") + _idle(p, f"{chart_id}-idle{i}"), class_="pair")
        panels.append(el("details", summary + body + _top_keys(p), class_="pattern", open=i < 3,
                         data_pattern=truncate(p["pattern"], 200)))
    more = ""
    if len(ordered) > MAX_PANELS:
        more = el("p", text(f"… {len(ordered) - MAX_PANELS} smaller patterns (see the JSON)"), class_="more")
    return el("div", "".join(panels) + more, class_="patterns")


def render_diff(rows: Sequence[Mapping[str, Any]], chart_id: str) -> str:
    """Growth per pattern between two scans: a bar of bytes gained or lost, largest change first."""
    ordered = sorted(rows, key=lambda r: -abs(_int(r.get("bytes_delta"))))[:MAX_GROWTH_ROWS]
    if not ordered:
        return el("p", "No patterns in either scan.", class_="none")
    top = max(abs(_int(r.get("bytes_delta"))) for r in ordered) or 1
    w, row_h, left = 960.0, 18.0, 330.0
    mid = left + (w - left) / 2
    half = (w - left) / 2 - 90
    out = []
    for i, r in enumerate(ordered):
        d = _int(r.get("bytes_delta"))
        bw = half * abs(d) / top
        y = 6 + i * row_h
        x = mid if d >= 0 else mid - bw
        title = (f"{r['pattern']}: {d:+,} bytes ({human_bytes(_int(r.get('bytes_old')))} → "
                 f"{human_bytes(_int(r.get('bytes_new')))}), {_int(r.get('keys_delta')):+,} keys"
                 + (" · new pattern" if r.get("new_pattern") else ""))
        out.append(el("g", el("title", text(title))
                      + el("text", text(truncate(r["pattern"], 46)), x=num(left - 8), y=num(y + 12), class_="tick",
                           text_anchor="end")
                      + el("rect", "", x=num(x), y=num(y + 2), width=num(max(1.0, bw)), height=num(row_h - 5),
                           class_=f"bar {'grow' if d > 0 else 'shrink'}")
                      + el("text", text(("+" if d > 0 else "") + human_bytes(d)), x=num(mid + bw + 4 if d >= 0
                                                                                       else mid - bw - 4),
                           y=num(y + 12), class_="tick", text_anchor="start" if d >= 0 else "end"),
                      class_="growth", data_pattern=truncate(r["pattern"], 200), data_delta=d))
    h = 12 + len(ordered) * row_h
    out.append(el("line", "", x1=num(mid), x2=num(mid), y1=2, y2=num(h - 4), class_="axis"))
    svg = el("svg", el("title", "Growth of each pattern between the scans", id=f"{chart_id}-title")
             + el("desc", text(f"{len(ordered)} pattern(s) with the largest change in bytes."), id=f"{chart_id}-desc")
             + "".join(out), id=chart_id, class_="chart growth-chart", role="img",
             aria_labelledby=f"{chart_id}-title {chart_id}-desc", viewBox=f"0 0 {num(w)} {num(h)}", width=num(w),
             height=num(h))
    return el("figure", el("div", svg, class_="scroll chart-box"), class_="growth-figure", data_rows=len(ordered))
