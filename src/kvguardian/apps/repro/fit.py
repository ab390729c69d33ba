"""Small fits for reproductions: growth exponents on log-log axes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["growth_exponent", "local_exponent", "quadratic_share"]


def growth_exponent(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of log(y) on log(x): y ∝ x^k gives k. NaN when fewer than 2 positive points."""
    pts = [(a, b) for a, b in zip(x, y) if a > 0 and b > 0]
    if len(pts) < 2:
        return math.nan
    lx = np.log([p[0] for p in pts])
    ly = np.log([p[1] for p in pts])
    return float(np.polyfit(lx, ly, 1)[0])


def local_exponent(x: Sequence[float], y: Sequence[float]) -> float:
    """The exponent between the last two points."""
    if len(x) < 2 or x[-1] <= 0 or x[-2] <= 0 or y[-1] <= 0 or y[-2] <= 0:
        return math.nan
    return math.log(y[-1] / y[-2]) / math.log(x[-1] / x[-2])


def quadratic_share(x: Sequence[float], y: Sequence[float]) -> float:
    """Fit y = c + a·x + b·x² (least squares); return b·x_max² / y_max: how much of the last value is quadratic."""
    if len(x) < 3:
        return math.nan
    b, _a, _c = np.polyfit(np.asarray(x, float), np.asarray(y, float), 2)
    return float(b * x[-1] ** 2 / y[-1]) if y[-1] else math.nan
