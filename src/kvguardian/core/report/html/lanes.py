"""Per-request lanes, like the active-memory view of PyTorch's memory viewer: one row per request with its KV
from start to end (live), then what outlived the end - until it was freed, or to the end of the record when it
is still alive (orphaned or retained, highlighted). Hovering a lane names the request, its tenant, its bytes and
the layers that outlived it; without JavaScript the same text is the lane's ``<title>``.

At most `MAX_LANES` lanes are drawn: every request that still holds KV after its end, then requests spread
evenly over the run; the figure says how many were left out.
"""

from __future__ import annotations

from kvguardian.core.report.history import History, RequestSpan
from kvguardian.core.report.html.axes import human_bytes, human_duration
from kvguardian.core.report.html.chart import Chart
from kvguardian.core.report.html.decimate import pick
from kvguardian.core.report.html.markup import el, num, text, truncate

__all__ = ["MAX_LANES", "render_lanes"]

MAX_LANES = 400
_ROW = 12


def _layers(r: RequestSpan) -> str:
    known = sorted(k for k in r.after_end if k >= 0)
    if not known:
        return ""
    shown = ", ".join(str(k) for k in known[:12]) + (", …" if len(known) > 12 else "")
    return f" in layer(s) {shown}"


def _describe(r: RequestSpan) -> str:
    parts = [f"request {r.id}"]
    if r.tenant is not None:
        parts.append(f"tenant {r.tenant}")
    parts.append(f"started {human_duration(r.start)}")
    parts.append("still active" if r.end is None else f"ended {human_duration(r.end)}")
    parts.append(f"owned {human_bytes(r.bytes)}")
    if r.bytes_after_end:
        parts.append(f"{human_bytes(r.bytes_after_end)} still alive after its end{_layers(r)} ({r.state})")
    elif r.released is not None and r.end is not None and r.released > r.end:
        parts.append(f"its KV outlived it by {human_duration(r.released - r.end)}, then was freed")
    return " · ".join(parts)


def _lane(r: RequestSpan, row: int, chart: Chart, now: float) -> str:
    x = chart.x
    y = row * _ROW + 2
    h = _ROW - 3
    end = r.end if r.end is not None else now
    shapes = [el("rect", "", x=num(x(r.start)), y=y, width=num(max(1.0, x(end) - x(r.start))), height=h,
                 class_="seg seg-live")]
    if r.end is not None:
        if r.bytes_after_end:
            shapes.append(el("rect", "", x=num(x(r.end)), y=y, width=num(max(2.0, x(now) - x(r.end))), height=h,
                             class_=f"seg seg-{r.state} seg-tail"))
        elif r.released is not None and r.released > r.end:
            shapes.append(el("rect", "", x=num(x(r.end)), y=y, width=num(max(1.0, x(r.released) - x(r.end))),
                             height=h, class_="seg seg-outlived"))
    return el("g", el("title", text(_describe(r))) + "".join(shapes), class_=f"lane lane-{r.state}",
              data_request=truncate(r.id, 200), data_state=r.state, tabindex="0")


def _label(r: RequestSpan, row: int, chart: Chart) -> str:
    label = truncate(r.id, 20) + (f" ({truncate(r.tenant, 10)})" if r.tenant else "")
    return el("text", text(label), x=chart.left - 6, y=num(chart.top + row * _ROW + _ROW - 3), class_="lane-label",
              text_anchor="end")


def render_lanes(hist: History, chart_id: str) -> str:
    """The lanes figure of one audit."""
    if not hist.requests:
        return el("p", "No requests were recorded.", class_="none")
    shown, left_out = pick(hist.requests, MAX_LANES, must=lambda r: r.bytes_after_end > 0)
    rows = len(shown)
    chart = Chart(chart_id, "KV of each request over time",
                  f"{rows} request lane(s); {sum(1 for r in shown if r.bytes_after_end)} with KV still alive after "
                  "the request ended.",
                  (0.0, max(hist.end, max((r.end or r.start) for r in shown))), (0.0, float(rows)),
                  y_kind="count", height=rows * _ROW + 40, top=6, bottom=30, left=180, y_ticks=False)
    chart.plot.extend(_lane(r, i, chart, hist.end) for i, r in enumerate(shown))
    chart.overlay.extend(_label(r, i, chart) for i, r in enumerate(shown))
    legend = el("ul", "".join(el("li", el("span", "", class_=f"swatch seg-{k}", aria_hidden="true") + text(label))
                              for k, label in (("live", "live (request running)"),
                                               ("orphaned", "orphaned after its end (still alive)"),
                                               ("retained", "retained after its end (declared)"),
                                               ("outlived", "outlived its end, since freed"))), class_="legend")
    note = ""
    dropped = left_out + hist.requests_dropped
    if dropped:
        note = el("p", text(f"{rows} of {rows + dropped} requests shown: every request with KV alive after its end, "
                            "then requests spread evenly over the run."), class_="note")
    return el("figure", el("div", chart.render(extra_class="lanes"), class_="scroll chart-box tall")
              + el("figcaption", legend + note), class_="lanes-figure", data_lanes=rows)
