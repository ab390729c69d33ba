"""Squarified treemap layout (Bruls, Huizing, van Wijk 2000): rectangles with areas proportional to the values
and aspect ratios near 1, filled row by row along the shorter side of what is left."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Rect", "squarify"]

Rect = tuple[float, float, float, float]  # x, y, width, height


def _worst(row: Sequence[float], side: float) -> float:
    s = sum(row)
    if s <= 0 or side <= 0:
        return float("inf")
    return max(max(row) * side * side / (s * s), s * s / (side * side * min(row)))


def _place(row: Sequence[float], x: float, y: float, w: float, h: float) -> tuple[list[Rect], Rect]:
    """Lay ``row`` (areas) along the shorter side of (x, y, w, h); return its rects and the space left."""
    s = sum(row)
    out: list[Rect] = []
    if w >= h:  # a column on the left
        cw = s / h if h else 0.0
        cy = y
        for a in row:
            rh = a / cw if cw else 0.0
            out.append((x, cy, cw, rh))
            cy += rh
        return out, (x + cw, y, w - cw, h)
    rh = s / w if w else 0.0  # a row on top
    cx = x
    for a in row:
        cw = a / rh if rh else 0.0
        out.append((cx, y, cw, rh))
        cx += cw
    return out, (x, y + rh, w, h - rh)


def squarify(values: Sequence[float], x: float, y: float, w: float, h: float) -> list[Rect]:
    """Rectangles for ``values`` (positive, largest first) filling (x, y, w, h), in the same order."""
    total = sum(values)
    if total <= 0 or w <= 0 or h <= 0:
        return [(x, y, 0.0, 0.0) for _ in values]
    areas = [v * w * h / total for v in values]
    out: list[Rect] = []
    row: list[float] = []
    i = 0
    while i < len(areas):
        side = min(w, h)
        a = areas[i]
        if not row or _worst([*row, a], side) <= _worst(row, side):
            row.append(a)
            i += 1
            continue
        placed, (x, y, w, h) = _place(row, x, y, w, h)
        out.extend(placed)
        row = []
    if row:
        placed, _ = _place(row, x, y, w, h)
        out.extend(placed)
    return out
