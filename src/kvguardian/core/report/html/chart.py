"""The frame every x/y chart of the report is drawn in: one SVG with a title and a description for assistive
technology, axes with round ticks, and a plot area that the page script can zoom along x.

The plot area is a nested ``<svg class="plot">`` whose viewBox starts equal to its size; zooming only changes
that viewBox (shapes keep their coordinates, strokes do not scale), and the script relabels the x axis from the
domain in ``data-x0``/``data-x1``. Without JavaScript the chart is complete as drawn. Every shape may carry a
``<title>``: the browser shows it on hover without any script.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvguardian.core.report.html.axes import Scale, human_bytes, human_duration, nice_ticks
from kvguardian.core.report.html.markup import el, num, text

__all__ = ["Chart", "format_value"]

_FORMATS: dict[str, Callable[[float], str]] = {
    "bytes": human_bytes,
    "seconds": human_duration,
    "count": lambda v: f"{v:,.0f}",
}


def format_value(kind: str, value: float) -> str:
    """A tick or tooltip value of an axis of ``kind`` (bytes, seconds, count)."""
    return _FORMATS.get(kind, _FORMATS["count"])(value)


@dataclass
class Chart:
    """An x/y chart; add shapes in plot coordinates (`x`, `y` map data to them) to `plot`, then `render`."""

    chart_id: str  # unique in the page: the SVG's id and the prefix of its title/desc ids
    title: str
    desc: str  # one sentence a screen reader says about the chart
    x_domain: tuple[float, float]
    y_domain: tuple[float, float]
    x_kind: str = "seconds"
    y_kind: str = "bytes"
    width: int = 960
    height: int = 300
    left: int = 76
    right: int = 16
    top: int = 10
    bottom: int = 30
    zoom: bool = True
    plot: list[str] = field(default_factory=list)  # shapes in plot coordinates
    overlay: list[str] = field(default_factory=list)  # anything in chart coordinates (labels)
    rug: list[str] = field(default_factory=list)  # marks under the plot: plot x, y in 0..rug_height; zoomed too
    rug_height: int = 0
    y_ticks: bool = True

    def __post_init__(self) -> None:
        x0, x1 = self.x_domain
        if not x1 > x0:
            self.x_domain = (x0, x0 + 1.0)
        y0, y1 = self.y_domain
        if not y1 > y0:
            self.y_domain = (y0, y0 + 1.0)

    @property
    def plot_width(self) -> float:
        return float(self.width - self.left - self.right)

    @property
    def plot_height(self) -> float:
        return float(self.height - self.top - self.bottom - self.rug_height)

    @property
    def x(self) -> Scale:
        return Scale(self.x_domain[0], self.x_domain[1], 0.0, self.plot_width)

    @property
    def y(self) -> Scale:
        return Scale(self.y_domain[0], self.y_domain[1], self.plot_height, 0.0)

    def render(self, *, extra_class: str = "") -> str:
        pw, ph = self.plot_width, self.plot_height
        parts = [
            el("title", text(self.title), id=f"{self.chart_id}-title"),
            el("desc", text(self.desc), id=f"{self.chart_id}-desc"),
            self._y_axis() if self.y_ticks else "",
            self._x_axis(),
            el("svg", "".join(self.plot), class_="plot", x=self.left, y=self.top, width=num(pw), height=num(ph),
               viewBox=f"0 0 {num(pw)} {num(ph)}", preserveAspectRatio="none"),
            el("rect", "", class_="frame", x=self.left, y=self.top, width=num(pw), height=num(ph)),
            el("svg", "".join(self.rug), class_="plot rug", x=self.left, y=num(self.top + ph), width=num(pw),
               height=self.rug_height, viewBox=f"0 0 {num(pw)} {self.rug_height}", preserveAspectRatio="none")
            if self.rug else "",
            "".join(self.overlay),
        ]
        return el(
            "svg", "".join(parts), id=self.chart_id, class_=f"chart {extra_class}".strip(), role="img",
            aria_labelledby=f"{self.chart_id}-title {self.chart_id}-desc", viewBox=f"0 0 {self.width} {self.height}",
            width=self.width, height=self.height, data_zoom="x" if self.zoom else None,
            data_x0=repr(float(self.x_domain[0])), data_x1=repr(float(self.x_domain[1])), data_xkind=self.x_kind,
            data_left=self.left, data_plotwidth=num(pw),
        )

    def _x_axis(self) -> str:
        x0, x1 = self.x_domain
        base = self.top + self.plot_height + self.rug_height
        ticks = []
        for v in nice_ticks(x0, x1, max(2, int(self.plot_width // 110)), binary=self.x_kind == "bytes"):
            px = self.left + self.x(v)
            ticks.append(el("line", "", x1=num(px), x2=num(px), y1=num(base), y2=num(base + 4)))
            ticks.append(el("text", text(format_value(self.x_kind, v)), x=num(px), y=num(base + 16),
                            class_="tick", text_anchor="middle"))
        return el("g", "".join(ticks), class_="xaxis")

    def _y_axis(self) -> str:
        y0, y1 = self.y_domain
        ticks = []
        for v in nice_ticks(y0, y1, max(2, int(self.plot_height // 45)), binary=self.y_kind == "bytes"):
            py = self.top + self.y(v)
            ticks.append(el("line", "", class_="grid", x1=self.left, x2=num(self.left + self.plot_width),
                            y1=num(py), y2=num(py)))
            ticks.append(el("text", text(format_value(self.y_kind, v)), x=self.left - 6, y=num(py + 4),
                            class_="tick", text_anchor="end"))
        return el("g", "".join(ticks), class_="yaxis")
