"""The layer × request heat map of KV bytes alive after the owner ended: which requests left KV behind, and in
which layers. A colour class per cell on a log scale of bytes (the legend gives each class's range); each cell's
``<title>`` names the request, the layer, the bytes and the state.

Columns are the requests with KV after their end - at most `MAX_COLUMNS`, those with the most bytes, in the order
they started.
"""

from __future__ import annotations

import math

from kvguardian.core.report.history import History, RequestSpan
from kvguardian.core.report.html.axes import human_bytes
from kvguardian.core.report.html.markup import el, num, text, truncate

__all__ = ["MAX_COLUMNS", "render_heatmap"]

MAX_COLUMNS = 160
_CLASSES = 8


def _classes(lo: int, hi: int) -> list[float]:
    """Upper bounds of the colour classes (log scale from lo to hi)."""
    lo = min(lo, hi // 256)  # one value alone (or a narrow range) is drawn dark, not as the palest class
    a, b = math.log(max(lo, 1)), math.log(max(hi, 2))
    return [math.exp(a + (b - a) * (k + 1) / _CLASSES) for k in range(_CLASSES)]


def _klass(v: int, bounds: list[float]) -> int:
    for k, up in enumerate(bounds):
        if v <= up * (1 + 1e-9):
            return k
    return _CLASSES - 1


def _layer_name(layer: int) -> str:
    return "unknown layer" if layer < 0 else f"layer {layer}"


def render_heatmap(hist: History, chart_id: str) -> str:
    outlived = [r for r in hist.requests if r.bytes_after_end > 0]
    if not outlived:
        return el("p", "No KV outlived its request: every request's KV was freed (or is retained with its owner "
                       "still active).", class_="none", data_cells="0")
    cols: list[RequestSpan] = sorted(sorted(outlived, key=lambda r: -r.bytes_after_end)[:MAX_COLUMNS],
                                     key=lambda r: r.start)
    layers = sorted({k for r in cols for k in r.after_end})
    values = [b for r in cols for b in r.after_end.values() if b > 0]
    bounds = _classes(min(values), max(values))
    cw = max(4.0, min(22.0, 860.0 / len(cols)))
    ch = 14.0 if len(layers) <= 40 else 8.0
    left, top = 96.0, 8.0
    label_rows = 80.0 if cw >= 10 else 16.0
    width = left + cw * len(cols) + 16
    height = top + ch * len(layers) + label_rows
    cells = []
    for j, r in enumerate(cols):
        for i, layer in enumerate(layers):
            b = r.after_end.get(layer, 0)
            if b <= 0:
                continue
            k = _klass(b, bounds)
            title = el("title", text(f"request {r.id} · {_layer_name(layer)} · {human_bytes(b)} alive after the "
                                     f"request ended ({r.state})"))
            cells.append(el("rect", title, x=num(left + j * cw), y=num(top + i * ch), width=num(cw - 1),
                            height=num(ch - 1), class_=f"cell hm{k}", data_bytes=b))
    labels = [el("text", text(_layer_name(layer)), x=num(left - 6), y=num(top + i * ch + ch - 3), class_="tick",
                 text_anchor="end") for i, layer in enumerate(layers)]
    if cw >= 10:
        for j, r in enumerate(cols):
            x = left + j * cw + cw / 2
            y = top + ch * len(layers) + 6
            labels.append(el("text", text(truncate(r.id, 14)), x=num(x), y=num(y), class_="tick",
                             transform=f"rotate(60 {num(x)} {num(y)})"))
    svg = el("svg", el("title", "KV bytes alive after the owner ended, by layer and request", id=f"{chart_id}-title")
             + el("desc", text(f"{len(cols)} request(s) × {len(layers)} layer(s); "
                               f"{human_bytes(sum(values))} in all."), id=f"{chart_id}-desc")
             + "".join(cells) + "".join(labels),
             id=chart_id, class_="chart heatmap", role="img", aria_labelledby=f"{chart_id}-title {chart_id}-desc",
             viewBox=f"0 0 {num(width)} {num(height)}", width=num(width), height=num(height))
    prev = 0.0
    legend_items = []
    for k, up in enumerate(bounds):
        legend_items.append(el("li", el("span", "", class_=f"swatch hm{k}", aria_hidden="true")
                               + text(f"{human_bytes(prev)}–{human_bytes(up)}")))
        prev = up
    note = ""
    if len(outlived) > len(cols):
        note = el("p", text(f"{len(cols)} of {len(outlived)} requests with KV after their end shown (those with the "
                            "most bytes)."), class_="note")
    return el("figure", el("div", svg, class_="scroll chart-box")
              + el("figcaption", el("ul", "".join(legend_items), class_="legend") + note),
              class_="heatmap-figure", data_cells=len(cells))
