"""Bounded views of unbounded data: what keeps a report of 100,000 requests within its size budget.

- `thin_rows` halves a sample series until it fits, keeping of each pair the sample with the larger total
  (a peak is never lost) and summing the columns that count events in the interval.
- `pick` chooses which requests get a lane: every request that still holds KV after it ended first (those are
  the ones a reader looks for), then requests spread evenly over the run.
- `buckets` counts values in equal-width bins (request starts and ends drawn as a rug).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["buckets", "pick", "thin_rows"]

T = TypeVar("T")


def thin_rows(rows: Sequence[Sequence[float]], limit: int, *, value_cols: Sequence[int],
              summed_cols: Sequence[int] = ()) -> list[list[float]]:
    """At most ``limit`` rows of ``rows`` (column 0 is time). Pairs are merged: the row whose ``value_cols``
    sum is larger is kept, with ``summed_cols`` added over the pair."""
    out = [list(r) for r in rows]
    while len(out) > limit > 1:
        merged = []
        for i in range(0, len(out) - 1, 2):
            a, b = out[i], out[i + 1]
            keep = list(a if sum(a[c] for c in value_cols) > sum(b[c] for c in value_cols) else b)
            for c in summed_cols:
                keep[c] = a[c] + b[c]
            merged.append(keep)
        if len(out) % 2:
            merged.append(out[-1])
        out = merged
    return out


def pick(items: Sequence[T], limit: int, *, must: Callable[[T], bool]) -> tuple[list[T], int]:
    """Up to ``limit`` of ``items`` in their order: all for which ``must`` is true (up to ``limit``), then the
    others evenly spaced. Returns (the chosen, how many were left out)."""
    if len(items) <= limit:
        return list(items), 0
    first = [i for i, x in enumerate(items) if must(x)][:limit]
    room = limit - len(first)
    chosen = set(first)
    others = [i for i in range(len(items)) if i not in chosen]
    if room > 0 and others:
        step = len(others) / room
        chosen.update(others[int(k * step)] for k in range(room))
    picked = [items[i] for i in sorted(chosen)]
    return picked, len(items) - len(picked)


def buckets(values: Sequence[float], lo: float, hi: float, n: int) -> list[int]:
    """Counts of ``values`` in ``n`` equal bins over [lo, hi] (values outside are clamped)."""
    out = [0] * n
    span = hi - lo
    if n <= 0 or span <= 0:
        if n > 0:
            out[0] = len(values)
        return out
    for v in values:
        k = int((v - lo) / span * n)
        out[min(n - 1, max(0, k))] += 1
    return out
