"""SGLang's token conservation, checked from its exported gauges (KVG206).

Always: ``available + evictable + used`` above ``max_total`` on ``confirm`` scrapes (tokens counted twice, e.g.
an over-free). While idle past the grace period: tokens still used, or neither free, cached nor used (a leak).
A build that stops refreshing the gauges while idle silences the idle check, never a false alarm. Tested on
stand-ins serving SGLang's real metric names (``tests/engine_fakes.py``). Details: docs/design/engines.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Finding, Severity
from kvguardian.runtime.engines.board import FindingBoard
from kvguardian.runtime.engines.promtext import Sample, Scrape

__all__ = ["METRICS_READ", "SglangConservationCheck"]

TOTAL = "sglang:max_total_num_tokens"
AVAILABLE = "sglang:kv_available_tokens"
EVICTABLE = "sglang:kv_evictable_tokens"
USED = "sglang:kv_used_tokens"
SESSION_HELD = "sglang:streaming_session_held_tokens"
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
CACHE_HIT_RATE = "sglang:cache_hit_rate"

#: SGLang metrics kv-guardian reads (the watcher) or queries (rules and dashboard).
METRICS_READ = (TOTAL, AVAILABLE, EVICTABLE, USED, SESSION_HELD, RUNNING, QUEUED, TOKEN_USAGE, CACHE_HIT_RATE)

SeriesKey = tuple[tuple[str, str], ...]


def _value(samples: Sequence[Sample], key: SeriesKey) -> float | None:
    for s in samples:
        if s.key() == key:
            return s.value
    return samples[0].value if len(samples) == 1 else None


@dataclass
class _Series:
    over_count_streak: int = 0
    idle_since: float | None = None
    unaccounted: float = 0.0


class _Point(NamedTuple):
    """One series' numbers in one scrape."""

    key: SeriesKey
    numbers: dict[str, float | None]
    rank: str  # the series' labels, for messages
    now: float


class SglangConservationCheck:
    """Feed it each scrape; it raises and resolves KVG206 on the board."""

    def __init__(self, board: FindingBoard, *, grace: float = 60.0, tolerance: int = 0, confirm: int = 2) -> None:
        if grace < 0 or tolerance < 0 or confirm < 1:
            raise UsageError(f"need grace >= 0, tolerance >= 0, confirm >= 1; got {grace!r}, {tolerance!r}, "
                             f"{confirm!r}")
        self.board = board
        self.grace = grace
        self.tolerance = tolerance
        self.confirm = confirm
        self._series: dict[SeriesKey, _Series] = {}

    def observe(self, scrape: Scrape, now: float) -> None:
        """Check one scrape.

        Raises:
            UsageError: the page lacks SGLang's token gauges (not SGLang, or an SGLang without them).
        """
        missing = [n for n in (TOTAL, AVAILABLE, EVICTABLE, USED) if n not in scrape]
        if missing:
            raise UsageError(
                f"the metrics page lacks {', '.join(missing)}; fix: point --metrics at an SGLang server started "
                "with --enable-metrics (a version that exports the kv_*_tokens gauges)"
            )
        for s in scrape[AVAILABLE]:
            key = s.key()
            vals = {n: _value(scrape.get(n, []), key) for n in (TOTAL, EVICTABLE, USED, SESSION_HELD, RUNNING, QUEUED)}
            total, evictable, used = vals[TOTAL], vals[EVICTABLE], vals[USED]
            if total is None or evictable is None or used is None:
                continue
            st = self._series.setdefault(key, _Series())
            held = vals[SESSION_HELD] or 0.0
            counted = s.value + evictable + used
            st.unaccounted = total - counted - held
            numbers = {"max_total_tokens": total, "available_tokens": s.value, "evictable_tokens": evictable,
                       "used_tokens": used, "session_held_tokens": vals[SESSION_HELD],
                       "running_requests": vals[RUNNING], "queued_requests": vals[QUEUED]}
            rank = ",".join(f"{k}={v}" for k, v in key) or "(no labels)"
            point = _Point(key, numbers, rank, now)
            self._over_count(point, st, counted - total)
            self._idle(point, st, vals[RUNNING] == 0 and vals[QUEUED] == 0, used)

    def _over_count(self, point: _Point, st: _Series, excess: float) -> None:
        key, numbers, rank, now = point
        fkey = ("KVG206", "over-count", key)
        st.over_count_streak = st.over_count_streak + 1 if excess > self.tolerance else 0
        if st.over_count_streak < self.confirm:
            if excess <= self.tolerance:
                self.board.resolve(fkey, now)
            return
        self.board.raise_(fkey, Finding(
            id="KVG206", severity=Severity.ERROR,
            message=(f"SGLang {rank}: available + evictable + used = {numbers['available_tokens']:.0f} + "
                     f"{numbers['evictable_tokens']:.0f} + {numbers['used_tokens']:.0f} exceeds the pool's "
                     f"{numbers['max_total_tokens']:.0f} tokens by {excess:.0f} on {st.over_count_streak} "
                     "consecutive scrapes: tokens are counted twice (an over-free or double free)"),
            evidence={**numbers, "series_labels": dict(key), "excess_tokens": excess,
                      "consecutive_scrapes": st.over_count_streak},
        ), now)

    def _idle(self, point: _Point, st: _Series, idle: bool, used: float) -> None:
        key, numbers, rank, now = point
        fkey = ("KVG206", "idle", key)
        leaking = idle and (used > self.tolerance or st.unaccounted > self.tolerance)
        if not leaking:
            st.idle_since = None
            self.board.resolve(fkey, now)
            return
        if st.idle_since is None:
            st.idle_since = now
        if now - st.idle_since < self.grace:
            return
        parts = []
        if used > self.tolerance:
            parts.append(f"{used:.0f} tokens are locked as used")
        if st.unaccounted > self.tolerance:
            parts.append(f"{st.unaccounted:.0f} tokens are neither available, evictable, used nor session-held")
        self.board.raise_(fkey, Finding(
            id="KVG206", severity=Severity.ERROR,
            message=(f"SGLang {rank} runs and queues no request for {now - st.idle_since:.1f} s, yet "
                     + " and ".join(parts) + f" (pool {numbers['max_total_tokens']:.0f} tokens): memory leak"),
            evidence={**numbers, "series_labels": dict(key), "unaccounted_tokens": st.unaccounted,
                      "idle_seconds": round(now - st.idle_since, 3), "grace_seconds": self.grace},
        ), now)

    def max_unaccounted(self) -> float:
        return max((s.unaccounted for s in list(self._series.values())), default=0.0)  # list(): the exporter's thread
