"""The KV timeline: bytes by state over time (stacked: orphaned, retained, live), the bytes released so far
(a line on the right axis), request starts and ends as rugs under the plot, and the KVG103 trend line where
it fired. Values are steps, nothing is interpolated: a sample is drawn over the interval up to it.

Each series is a ``<g class="series" data-series="live">`` with a ``<title>``; the legend is HTML text; a
``<details>`` holds the numbers as a table for readers who cannot see the chart.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvguardian.core.report.document import FindingView
from kvguardian.core.report.history import History, Sample, as_rows
from kvguardian.core.report.html.axes import Scale, human_bytes, human_duration
from kvguardian.core.report.html.chart import Chart
from kvguardian.core.report.html.decimate import buckets, thin_rows
from kvguardian.core.report.html.markup import el, num, text

__all__ = ["STACK", "render_timeline"]

#: stacked series, bottom first: what outlived its owner sits at the bottom, where KVG103 draws its trend
STACK = ("orphaned", "retained", "live")
_MAX_POINTS = 800  # samples drawn (the buffer holds more; pairs are merged keeping peaks)
_RUG_BINS = 240
_TABLE_ROWS = 60


def _steps(ts: Sequence[float], values: Sequence[float]) -> list[tuple[float, float]]:
    """Each sample drawn over the interval that led up to it (step-before): samples are taken at request ends
    and at interval ends, where a request's KV peaks, so the step shows the bytes the interval reached."""
    pts: list[tuple[float, float]] = []
    for i, (t, v) in enumerate(zip(ts, values)):
        if i:
            pts.append((ts[i - 1], v))
        pts.append((t, v))
    return pts


def _polygon(samples: Sequence[Sample], chart: Chart, lower: Sequence[float], upper: Sequence[float]) -> str:
    x, y = chart.x, chart.y
    ts = [s.t for s in samples]
    top = [f"{num(x(t))},{num(y(v))}" for t, v in _steps(ts, upper)]
    bottom = [f"{num(x(t))},{num(y(v))}" for t, v in reversed(_steps(ts, lower))]
    return " ".join(top + bottom)


def _areas(samples: Sequence[Sample], chart: Chart) -> list[str]:
    out = []
    base = [0.0] * len(samples)
    for name in STACK:
        values = [getattr(s, name) for s in samples]
        upper = [b + v for b, v in zip(base, values)]
        peak = max(values, default=0.0)
        title = el("title", text(f"{name}: peak {human_bytes(peak)}, last {human_bytes(values[-1] if values else 0)}"))
        shape = el("polygon", "", points=_polygon(samples, chart, base, upper), class_=f"area st-{name}")
        out.append(el("g", title + shape, class_="series", data_series=name, data_peak=int(peak)))
        base = upper
    return out


def _released(samples: Sequence[Sample], chart: Chart) -> tuple[str, Scale]:
    top = max((s.released for s in samples), default=0.0) or 1.0
    ry = Scale(0.0, top * 1.05, chart.plot_height, 0.0)
    pts = " ".join(f"{num(chart.x(t))},{num(ry(v))}" for t, v in _steps([s.t for s in samples],
                                                                         [s.released for s in samples]))
    title = el("title", text(f"released so far: {human_bytes(samples[-1].released if samples else 0)}"))
    line = el("polyline", "", points=pts, class_="line st-released")
    return el("g", title + line, class_="series", data_series="released", data_peak=int(top)), ry


def _right_axis(chart: Chart, ry: Scale) -> str:
    from kvguardian.core.report.html.axes import nice_ticks

    x = chart.left + chart.plot_width
    out = []
    for v in nice_ticks(ry.d0, ry.d1, 4, binary=True):
        py = chart.top + ry(v)
        out.append(el("text", text(human_bytes(v)), x=num(x + 4), y=num(py + 4), class_="tick released-tick"))
    return el("g", "".join(out), class_="raxis")


def _rug(hist: History, chart: Chart) -> list[str]:
    """Request starts (upper row) and ends (lower row) under the plot: a tick per request, or per bin of
    requests when there are many."""
    x0, x1 = chart.x_domain
    ended = [r for r in hist.requests if r.end is not None]
    rows = []
    for row, (what, spans, values) in enumerate((
        ("started", hist.requests, [r.start for r in hist.requests]),
        ("ended", ended, [r.end for r in ended if r.end is not None]),
    )):
        y = 2 + row * 8
        ticks = []
        if len(values) <= _RUG_BINS:
            for r, v in zip(spans, values):
                px = chart.x(v)
                ticks.append(el("line", el("title", text(f"request {r.id} {what} at {human_duration(v)}")),
                                x1=num(px), x2=num(px), y1=y, y2=y + 6, class_=f"mark mark-{what}"))
        else:
            width = (x1 - x0) / _RUG_BINS
            for k, c in enumerate(buckets(values, x0, x1, _RUG_BINS)):
                if c:
                    lo = x0 + k * width
                    px = chart.x(lo + width / 2)
                    ticks.append(el("line", el("title", text(f"{c} request(s) {what} between {human_duration(lo)} "
                                                             f"and {human_duration(lo + width)}")),
                                    x1=num(px), x2=num(px), y1=y, y2=y + 6, class_=f"mark mark-{what}"))
        rows.append(el("g", "".join(ticks), class_=f"rug rug-{what}", data_marks=len(values)))
    return rows


def _trend(hist: History, chart: Chart, findings: Sequence[FindingView]) -> str:
    for f in findings:
        line = f.evidence.get("trend_line") if f.id == "KVG103" else None
        if not (isinstance(line, list) and len(line) == 2 and all(isinstance(p, list) and len(p) == 2 for p in line)):
            continue
        try:
            (t0, b0), (t1, b1) = ((float(t) - hist.origin, float(b)) for t, b in line)
        except (TypeError, ValueError):
            continue
        title = el("title", text(f"KVG103 trend: {human_bytes(b0)} → {human_bytes(b1)} over "
                                 f"{human_duration(t1 - t0)} ({f.message})"))
        return el("g", title + el("line", "", x1=num(chart.x(t0)), y1=num(chart.y(b0)), x2=num(chart.x(t1)),
                                  y2=num(chart.y(b1)), class_="trend"), class_="trend-line", data_finding="KVG103")
    return ""


def _legend(has_trend: bool) -> str:
    items = [el("li", el("span", "", class_=f"swatch st-{n}", aria_hidden="true") + text(n))
             for n in (*reversed(STACK), "released")]
    labels = {"released": "released (so far, right axis)"}
    items[-1] = el("li", el("span", "", class_="swatch st-released", aria_hidden="true") + text(labels["released"]))
    if has_trend:
        items.append(el("li", el("span", "", class_="swatch trend", aria_hidden="true") + "KVG103 trend"))
    return el("ul", "".join(items), class_="legend")


def _table(samples: Sequence[Sample]) -> str:
    rows = thin_rows(as_rows(samples), _TABLE_ROWS, value_cols=(1, 2, 3))
    head = "".join(el("th", h, scope="col") for h in ("t", "live", "retained", "orphaned", "released so far"))
    body = "".join(el("tr", el("td", text(human_duration(r[0]))) + "".join(el("td", text(human_bytes(v)))
                                                                         for v in r[1:])) for r in rows)
    return el("details", el("summary", "the numbers") + el("div", el("table", el("thead", el("tr", head))
                                                                      + el("tbody", body)), class_="scroll"),
              class_="data")


def render_timeline(hist: History, findings: Sequence[FindingView], chart_id: str) -> str:
    """The timeline figure of one audit."""
    if not hist.samples:
        return el("p", "No timeline samples: nothing was sampled (no request ended and no interval passed).",
                  class_="none")
    rows = thin_rows(as_rows(hist.samples), _MAX_POINTS, value_cols=(1, 2, 3))
    samples = [Sample(*r) for r in rows]
    peak = max(s.alive for s in samples)
    chart = Chart(chart_id, "KV bytes by state over time",
                  f"Stacked KV bytes (orphaned, retained, live) over {human_duration(hist.end)}; peak "
                  f"{human_bytes(peak)}; {len(hist.requests)} request(s) marked.",
                  (0.0, max(hist.end, samples[-1].t)), (0.0, (peak or 1.0) * 1.08), height=300, bottom=30, right=64,
                  rug_height=18)
    chart.plot.extend(_areas(samples, chart))
    released, ry = _released(samples, chart)
    chart.plot.append(released)
    trend = _trend(hist, chart, findings)
    chart.plot.append(trend)
    chart.overlay.append(_right_axis(chart, ry))
    chart.rug.extend(_rug(hist, chart))
    note = ""
    if len(rows) < len(hist.samples) or hist.stride > 1:
        note = el("p", text(f"{len(hist.samples)} samples kept by the ledger (each covering {hist.stride} sampling "
                            f"interval(s)), {len(rows)} drawn; peaks are kept when samples are merged."),
                  class_="note")
    fig = el("div", chart.render(extra_class="timeline"), class_="scroll chart-box")
    return el("figure", fig + el("figcaption", _legend(bool(trend)) + note) + _table(hist.samples),
              class_="timeline-figure", data_series_count=len(STACK) + 1)
