"""Watermarks and the state they put the guard in, with hysteresis so that it does not flap.

    ratio  >= evict      evict (prefix-cache blocks, then retained caches, then preempt if configured)
    ratio  >= drain      drain: readiness false, new requests 503 + Retry-After, in-flight requests finish
    ratio  >= shed       while draining and still rising: shed the newest requests with a clear error

The pressure is the highest ratio (used / limit) over the signals that could be read. Evicting stays on
until the pressure falls below ``evict - hysteresis``; each eviction pass aims there. Draining stays on
until it falls below ``drain - hysteresis``. `decide` is a pure function of the previous state and the
pressure, so the policy is tested without any memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvguardian.core.errors import UsageError

__all__ = ["PolicyState", "Watermarks", "decide"]


@dataclass(frozen=True)
class Watermarks:
    """Fractions of each signal's limit. Defaults: the article's 92 % and 97 %, shedding at 99 %."""

    evict: float = 0.92
    drain: float = 0.97
    shed: float = 0.99
    hysteresis: float = 0.03

    def __post_init__(self) -> None:
        for name in ("evict", "drain", "shed", "hysteresis"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v != v:  # NaN
                raise UsageError(f"watermark {name}={v!r} is not a number; fix: a fraction such as 0.92")
        if not 0 < self.evict < self.drain < self.shed <= 1:
            raise UsageError(
                f"watermarks out of order: evict {self.evict}, drain {self.drain}, shed {self.shed}; fix: "
                "0 < evict < drain < shed <= 1, e.g. --evict 0.92 --drain 0.97 --shed 0.99"
            )
        if not 0 <= self.hysteresis < self.evict:
            raise UsageError(f"hysteresis {self.hysteresis} must be >= 0 and below the evict watermark "
                             f"{self.evict}; fix: e.g. --hysteresis 0.03")

    @property
    def evict_target(self) -> float:
        """Where an eviction pass aims: below the evict watermark by the hysteresis."""
        return self.evict - self.hysteresis


@dataclass(frozen=True)
class PolicyState:
    evicting: bool = False  # the pressure crossed the evict watermark and has not fallen below its release
    draining: bool = False  # likewise for the drain watermark
    act_evict: bool = False  # this sample is at or above the evict watermark: run an eviction pass
    act_shed: bool = False  # draining and at or above the shed watermark: shed the newest requests


def decide(prev: PolicyState, pressure: float | None, wm: Watermarks) -> PolicyState:
    """The next state. An unknown pressure (no signal could be read) keeps the latches and acts on nothing:
    fail-open, the guard never drains a server because it cannot see."""
    if pressure is None:
        return PolicyState(prev.evicting, prev.draining)
    evicting = pressure >= wm.evict or (prev.evicting and pressure >= wm.evict - wm.hysteresis)
    draining = pressure >= wm.drain or (prev.draining and pressure >= wm.drain - wm.hysteresis)
    return PolicyState(evicting, draining, act_evict=pressure >= wm.evict, act_shed=draining and pressure >= wm.shed)
