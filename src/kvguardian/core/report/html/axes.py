"""Scales, ticks and the units of the report's charts: bytes (binary units) and seconds.

`nice_ticks` picks round tick values (1, 2, 5 × 10^k; for bytes also powers of two of KiB, MiB, ...), so every
chart's axes read the same way. The page script recomputes ticks with the same rule when a chart is zoomed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Scale", "human_bytes", "human_duration", "nice_ticks"]

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; ``None`` -> ``—``."""
    if n is None or not math.isfinite(n):
        return "—"
    sign = "-" if n < 0 else ""
    v = abs(float(n))
    for unit in _BYTE_UNITS:
        if v < 1024 or unit == _BYTE_UNITS[-1]:
            if unit == "B":
                return f"{sign}{v:.0f} B"
            return f"{sign}{v:.1f} {unit}" if v < 100 else f"{sign}{v:.0f} {unit}"
        v /= 1024
    return f"{sign}{v:.0f} PiB"  # pragma: no cover


def human_duration(s: float | None) -> str:
    """Seconds as ``850 ms``, ``42 s``, ``3.5 min``, ``2.0 h``, ``1.5 d``; ``None`` -> ``—``."""
    if s is None or not math.isfinite(s):
        return "—"
    a = abs(s)
    sign = "-" if s < 0 else ""
    if a == 0:
        return "0 s"
    if a < 1:
        return f"{sign}{a * 1000:.0f} ms"
    if a < 120:
        return f"{sign}{a:.3g} s"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if a >= 2 * size or unit == "min":
            return f"{sign}{a / size:.1f} {unit}"
    return f"{sign}{a:.0f} s"  # pragma: no cover


def _step(span: float, count: int, binary: bool) -> float:
    raw = span / max(1, count)
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    if binary and raw >= 1024:
        unit = 1024 ** int(math.log(raw, 1024))
        for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
            if unit * m >= raw:
                return float(unit * m)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return float(m * mag)
    return float(10 * mag)  # pragma: no cover


def nice_ticks(lo: float, hi: float, count: int = 5, *, binary: bool = False) -> list[float]:
    """Round tick values covering [lo, hi] (about ``count`` of them); binary steps for byte axes."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else [0.0]
    step = _step(hi - lo, count, binary)
    first = math.ceil(lo / step - 1e-9) * step
    ticks: list[float] = []
    v = first
    while v <= hi + step * 1e-9 and len(ticks) < 50:
        ticks.append(v)
        v += step
    return ticks


@dataclass(frozen=True)
class Scale:
    """Linear map of a data domain [d0, d1] onto a pixel range [r0, r1] (r1 < r0 for a y axis)."""

    d0: float
    d1: float
    r0: float
    r1: float

    def __call__(self, v: float) -> float:
        span = self.d1 - self.d0
        if span == 0:
            return self.r0
        return self.r0 + (v - self.d0) / span * (self.r1 - self.r0)
