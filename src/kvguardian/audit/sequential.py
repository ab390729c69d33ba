"""An anytime-valid sequential test of "is the hit procedure faster than the miss procedure".

Each *round* gives one paired observation: the time to first token of an attacker request that repeats a
victim's prompt (hit procedure) and of one with a fresh prompt of the same length (miss procedure), sent
back to back in random order. Two nonnegative test supermartingales (e-processes) run side by side:

- **sharing** (`e_share`). Null H0: no sharing, so the two requests of a round are exchangeable and, because
  their order is a fair coin, ``X = [hit faster than miss]`` is Bernoulli(1/2) whatever the noise, drift or
  distribution of the timings. The e-process is the average, over a grid of alternatives ``p``, of the
  likelihood ratios ``prod (p/0.5)^X ((1-p)/0.5)^(1-X)``: under H0 (any P(X=1) <= 1/2 given the past) it is
  a supermartingale with mean <= 1, so by Ville's inequality P(it ever reaches 1/alpha) <= alpha.
  Crossing 1/alpha decides "sharing" with a false-alarm probability <= alpha, at whatever round it happens.
- **no sharing of size r** (`e_clean`). Null H1: sharing with at least the minimum effect, i.e. in at least
  half the rounds the miss request takes >= ``min_effect`` times as long as the hit request. With
  ``Y = [miss / hit >= min_effect]`` (P(Y=1) >= 1/2 under H1), the average over ``q < 1/2`` of
  ``prod (q/0.5)^Y ((1-q)/0.5)^(1-Y)`` is a supermartingale under H1; crossing 1/beta decides "no sharing"
  with a probability <= beta of doing so while sharing of that size exists.

The test stops at the first crossing (both guarantees hold under optional stopping) or at ``max_samples``
rounds, where it says *undecided* and reports its numbers: it never guesses. If both cross on the same
round, "sharing" wins (its guarantee needs nothing about effect sizes). The reported p-values are the
anytime-valid ``min(1, 1 / max e)`` of each e-process. The only assumption is the one the design enforces:
under no sharing, which of a round's two requests is the repeat does not change its timing distribution
(same length, random order, adjacent in time, so slow drift cancels within the pair).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from kvguardian._errors import UsageError

__all__ = ["SequentialTest"]

#: Alternatives P(hit faster) for the sharing e-process, and P(speedup >= min_effect) for the clean one.
SHARE_GRID = (0.6, 0.7, 0.8, 0.9, 0.97)
CLEAN_GRID = (0.03, 0.1, 0.25, 0.4)


@dataclass
class SequentialTest:
    """Feed rounds with `add`; read `verdict` (True: sharing, False: none of ``min_effect``, None: not yet)."""

    alpha: float = 1e-3
    beta: float = 1e-3
    min_effect: float = 1.5
    max_samples: int = 60
    hit: list[float] = field(default_factory=list)  # seconds, one per round
    miss: list[float] = field(default_factory=list)
    _log_share: list[float] = field(default_factory=lambda: [0.0] * len(SHARE_GRID))
    _log_clean: list[float] = field(default_factory=lambda: [0.0] * len(CLEAN_GRID))
    max_e_share: float = 1.0
    max_e_clean: float = 1.0
    decided_at: int | None = None
    verdict: bool | None = None

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if not 0 < v < 0.5:
                raise UsageError(f"--{name} must be in (0, 0.5), got {v!r}")
        if not self.min_effect > 1:
            raise UsageError(f"--min-effect must be > 1 (a TTFT ratio), got {self.min_effect!r}")
        if self.max_samples < 1:
            raise UsageError(f"--max-samples must be >= 1, got {self.max_samples!r}")

    @property
    def samples(self) -> int:
        return len(self.hit)

    @property
    def done(self) -> bool:
        return self.verdict is not None or self.samples >= self.max_samples

    def add(self, t_hit: float, t_miss: float) -> None:
        """One round's two times to first token (seconds). A tie carries no information and moves nothing."""
        if self.done:
            return
        self.hit.append(t_hit)
        self.miss.append(t_miss)
        if t_hit != t_miss:
            x = t_hit < t_miss
            for i, p in enumerate(SHARE_GRID):
                self._log_share[i] += math.log((p if x else 1 - p) / 0.5)
        y = t_miss >= self.min_effect * t_hit
        for i, q in enumerate(CLEAN_GRID):
            self._log_clean[i] += math.log((q if y else 1 - q) / 0.5)
        self.max_e_share = max(self.max_e_share, _mean_exp(self._log_share))
        self.max_e_clean = max(self.max_e_clean, _mean_exp(self._log_clean))
        if self.max_e_share >= 1 / self.alpha:
            self.verdict, self.decided_at = True, self.samples
        elif self.max_e_clean >= 1 / self.beta:
            self.verdict, self.decided_at = False, self.samples

    @property
    def p_value(self) -> float:
        """Anytime-valid p-value of "no sharing"."""
        return min(1.0, 1.0 / self.max_e_share)

    @property
    def p_value_effect(self) -> float:
        """Anytime-valid p-value of "sharing with at least the minimum effect"."""
        return min(1.0, 1.0 / self.max_e_clean)

    def summary(self) -> dict[str, Any]:
        n = self.samples
        hit_ms = 1e3 * statistics.median(self.hit) if n else None
        miss_ms = 1e3 * statistics.median(self.miss) if n else None
        return {
            "verdict": self.verdict,
            "decision": {True: "sharing", False: "no-sharing", None: "undecided"}[self.verdict],
            "p_value": _round(self.p_value),
            "p_value_effect": _round(self.p_value_effect),
            "samples": n,
            "ttft_ratio": round(hit_ms / miss_ms, 4) if hit_ms and miss_ms else None,
            "ttft_ms": {"hit_median": _round(hit_ms), "miss_median": _round(miss_ms)},
            "hit_faster": sum(h < m for h, m in zip(self.hit, self.miss)),
        }


def _mean_exp(logs: list[float]) -> float:
    top = max(logs)
    if top > 700:  # far past any threshold; avoid overflow
        return math.inf
    return sum(math.exp(v) for v in logs) / len(logs)


def _round(v: float | None) -> float | None:
    return None if v is None else float(f"{v:.4g}")
