"""KVG103 kv-growth: retained KV bytes, sampled at every request end, grow monotonically.

Over the most recent windows (16 up to 256 samples) the series must pass four tests: a strict Mann–Kendall
trend (also in the window's second half), a positive Theil–Sen slope, rising floors across four blocks, and
new territory (beyond every earlier sample). A bounded cache still filling is a warning until its floor stops
rising, info when the retention verdicts prove it bounded. Why each test: docs/design/detectors.md.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvguardian.core.detectors.context import DetectContext
from kvguardian.core.findings import Finding, Severity
from kvguardian.core.ledger import EntryState, LedgerSnapshot

__all__ = ["TrendResult", "detect", "mann_kendall", "theil_sen", "trend_line", "trend_test"]

WINDOWS = (16, 24, 32, 48, 64, 96, 128, 192, 256)


def mann_kendall(x: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Return (S, one-sided p-value for an upward trend), tie-corrected, normal approximation."""
    a = np.asarray(x, dtype=float)
    n = a.size
    if n < 3:
        return 0.0, 1.0
    diff = np.sign(a[None, :] - a[:, None])  # diff[i, j] = sign(x_j - x_i)
    s = float(np.triu(diff, 1).sum())
    _, counts = np.unique(a, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(counts * (counts - 1) * (2 * counts + 5)))) / 18.0
    if var <= 0:
        return s, 1.0
    z = (s - 1) / math.sqrt(var) if s > 0 else ((s + 1) / math.sqrt(var) if s < 0 else 0.0)
    p = 0.5 * math.erfc(z / math.sqrt(2))
    return s, p


def theil_sen(x: Sequence[float] | np.ndarray) -> float:
    """Median of pairwise slopes (units of x per sample)."""
    a = np.asarray(x, dtype=float)
    n = a.size
    if n < 2:
        return 0.0
    i, j = np.triu_indices(n, 1)
    return float(np.median((a[j] - a[i]) / (j - i)))


def _floors_rise(a: np.ndarray) -> bool:
    blocks = np.array_split(a, 4)
    mins = [float(b.min()) for b in blocks]
    if any(m2 < m1 for m1, m2 in itertools.pairwise(mins)):
        return False
    return mins[-1] > float(blocks[0].max())


@dataclass(frozen=True)
class TrendResult:
    growing: bool
    window: int  # samples in the window that decided (the shortest that fired, or the longest tested)
    p_value: float
    slope: float  # Theil–Sen, units per sample
    growth: float  # last block's floor minus first block's floor over the window

    @property
    def confidence(self) -> float:
        return 1.0 - self.p_value


def trend_test(
    series: Sequence[float],
    *,
    alpha: float = 1e-5,
    recent_alpha: float = 5e-3,
    min_growth: float = 0.0,
    windows: Sequence[int] = WINDOWS,
) -> TrendResult:
    """Test the most recent windows of ``series`` for monotonic growth; the first window that fires wins."""
    a = np.asarray(series, dtype=float)
    last = TrendResult(False, 0, 1.0, 0.0, 0.0)
    for w in windows:
        if w > a.size:
            break
        win = a[-w:]
        prior = a[:-w]
        if prior.size and float(np.array_split(win, 4)[-1].min()) <= float(prior.max()):
            # the latest floor is still inside the range seen before the window: a bounded cache
            # wandering back up, not new territory
            last = TrendResult(False, w, 1.0, 0.0, 0.0)
            continue
        _, p = mann_kendall(win)
        _, p_recent = mann_kendall(win[w // 2:])
        slope = theil_sen(win)
        blocks = np.array_split(win, 4)
        growth = float(blocks[-1].min() - blocks[0].min())
        res = TrendResult(
            p < alpha and p_recent < recent_alpha and slope > 0 and growth > min_growth and _floors_rise(win),
            w, p, slope, growth,
        )
        if res.growing:
            return res
        last = res
    return last


def trend_line(window: Sequence[tuple[float, str, int]], slope: float) -> list[list[float]]:
    """The Theil–Sen line over a window of request-end samples, as its two ends ``[[t0, bytes], [t1, bytes]]``
    (``time.monotonic()`` times; the report's timeline draws it). Intercept: the median of y - slope·i."""
    if not window:
        return []
    ys = np.asarray([b for _, _, b in window], dtype=float)
    intercept = float(np.median(ys - slope * np.arange(ys.size)))
    return [[float(window[0][0]), intercept], [float(window[-1][0]), intercept + slope * (ys.size - 1)]]


def _bounded_retention(snapshot: LedgerSnapshot, ctx: DetectContext, window: int) -> str | None:
    """What holds the ended requests' KV, when the retention verdicts (`kvguardian.runtime.retention`) prove all of it
    bounded - an LRU that filled up, a memo of fixed prompts, a few conversations each continuing its own cache -
    else None. Single references explain growth only when they are few (under a quarter of the window): that
    many owners, each held by a name of its own, would be a namespace that grows with requests."""
    verdicts = ctx.options.get("retention") or {}
    if not verdicts or any(r.state is EntryState.RETAINED for r in snapshot.records):
        return None
    owners = {r.request_id for r in snapshot.records if r.state is EntryState.ORPHANED}
    if not owners or None in owners:
        return None
    found = [verdicts.get(o) for o in owners]
    if any(v is None or not v.bounded for v in found):
        return None
    whys = Counter(v.why for v in found if v is not None)
    if whys["single-reference"] * 4 >= window:
        return None
    return ", ".join(f"{n} {why}" for why, n in sorted(whys.items()))


def detect(snapshot: LedgerSnapshot, ctx: DetectContext) -> list[Finding]:
    series = [float(b) for (_, _, b) in snapshot.retained_series]
    res = trend_test(series, alpha=ctx.growth_alpha, min_growth=ctx.growth_min_bytes)
    if not res.growing:
        return []
    bounded = _bounded_retention(snapshot, ctx, res.window)
    tail = f"; all of it is bounded retention ({bounded}): a fill-up or live conversations" if bounded else ""
    return [
        Finding(
            id="KVG103",
            severity=Severity.INFO if bounded else Severity.WARNING,
            message=(
                f"retained KV grew by {res.growth:.0f} bytes over the last {res.window} requests "
                f"(≈{res.slope:.0f} bytes/request, Mann–Kendall p={res.p_value:.2g}, "
                f"confidence {res.confidence:.4f}){tail}"
            ),
            evidence={
                "bounded_retention": bounded,
                "window_requests": res.window,
                "slope_bytes_per_request": res.slope,
                "growth_bytes": res.growth,
                "p_value": res.p_value,
                "confidence": res.confidence,
                "samples": len(series),
                "latest_retained_bytes": series[-1] if series else 0,
                "trend_line": trend_line(snapshot.retained_series[-res.window:], res.slope),
            },
        )
    ]
