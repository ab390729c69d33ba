"""An anytime-valid sequential test of "is the hit procedure faster than the miss procedure".

Two test supermartingales run over paired rounds: `e_share` (null: no sharing, so "hit faster" is a fair coin)
and `e_clean` (null: sharing of at least ``min_effect``). Crossing 1/alpha or 1/beta decides, with the error
bounded by Ville's inequality under optional stopping; at ``max_samples`` the verdict is *undecided*, never a
guess. The construction and its one assumption: docs/design/isolation.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from kvguardian.core.errors import UsageError

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
