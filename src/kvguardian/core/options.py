"""Checks of the options a user passes to `Guard` (and other public constructors): a wrong value is refused at
once with one `UsageError` line naming the argument, what it must be and an example fix - never accepted to fail
later deep inside a check (``holder_search_seconds=-1`` used to end every holder search before it began).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from kvguardian.core.errors import UsageError

__all__ = ["Bounds", "check_flag", "check_guard", "check_int", "check_real"]


def _refuse(owner: str, name: str, value: object, must: str, example: str) -> UsageError:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return UsageError(f"{owner}({name}={shown}): {name} must be {must}; fix: e.g. {owner}({name}={example})")


def check_int(owner: str, name: str, value: object, *, minimum: int, example: int) -> int:
    """``value`` if it is an int >= ``minimum`` (not a bool), else `UsageError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _refuse(owner, name, value, f"an integer >= {minimum}", str(example))
    return value


class Bounds(NamedTuple):
    """The range a real-valued option must lie in: ``low < value <= high`` (``< high`` when ``open_high``)."""

    low: float
    high: float = math.inf
    open_high: bool = False

    def holds(self, value: float) -> bool:
        return self.low < value and (value < self.high if self.open_high else value <= self.high)

    def describe(self) -> str:
        if math.isfinite(self.high):
            return f"a number in ({self.low:g}, {self.high:g}{')' if self.open_high else ']'}"
        return f"a finite number > {self.low:g}"


def check_real(owner: str, name: str, value: Any, bounds: Bounds, example: float) -> float:
    """``value`` as a float if it is a finite real number within ``bounds``, else `UsageError`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not bounds.holds(value):
        raise _refuse(owner, name, value, bounds.describe(), f"{example:g}")
    return float(value)


def check_flag(owner: str, name: str, value: object) -> bool:
    """``value`` if it is a bool, else `UsageError` (a string such as ``"false"`` would be true)."""
    if not isinstance(value, bool):
        raise _refuse(owner, name, value, "True or False", "True")
    return value


def check_guard(args: Mapping[str, Any]) -> None:
    """Refuse a wrong `Guard` argument (`UsageError`, one line naming it and the fix); ``args`` maps each
    argument's name to its value."""
    for name in ("strict", "redact", "retention_sampling"):
        check_flag("Guard", name, args[name])
    check_int("Guard", "event_capacity", args["event_capacity"], minimum=1, example=65_536)
    check_int("Guard", "reuse_window", args["reuse_window"], minimum=1, example=100)
    check_int("Guard", "decode_stride", args["decode_stride"], minimum=1, example=8)
    check_real("Guard", "holder_search_seconds", args["holder_search_seconds"], Bounds(0), 120)
    check_real("Guard", "reuse_seconds", args["reuse_seconds"], Bounds(0), 60)
    check_real("Guard", "growth_alpha", args["growth_alpha"], Bounds(0, 1, open_high=True), 1e-5)
