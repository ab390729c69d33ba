"""Checks of the options a user passes to `Guard` (and other public constructors): a wrong value is refused at
once with one `UsageError` line naming the argument, what it must be and an example fix - never accepted to fail
later deep inside a check (``holder_search_seconds=-1`` used to end every holder search before it began).
"""

from __future__ import annotations

import math
from typing import Any

from kvguardian._errors import UsageError

__all__ = ["check_flag", "check_guard", "check_int", "check_real"]


def _refuse(owner: str, name: str, value: Any, must: str, example: str) -> UsageError:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return UsageError(f"{owner}({name}={shown}): {name} must be {must}; fix: e.g. {owner}({name}={example})")


def check_int(owner: str, name: str, value: Any, *, minimum: int, example: int) -> int:
    """``value`` if it is an int >= ``minimum`` (not a bool), else `UsageError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _refuse(owner, name, value, f"an integer >= {minimum}", str(example))
    return value


def check_real(owner: str, name: str, value: Any, *, low: float, high: float = math.inf, example: float,
               open_high: bool = False) -> float:
    """``value`` as a float if it is a finite real number with ``low < value`` and ``value <= high``
    (``value < high`` when ``open_high``), else `UsageError`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = low < value and (value < high if open_high else value <= high)
    if not ok:
        must = f"a finite number > {low:g}"
        if math.isfinite(high):
            must = f"a number in ({low:g}, {high:g}{')' if open_high else ']'}"
        raise _refuse(owner, name, value, must, f"{example:g}")
    return float(value)


def check_flag(owner: str, name: str, value: Any) -> bool:
    """``value`` if it is a bool, else `UsageError` (a string such as ``"false"`` would be true)."""
    if not isinstance(value, bool):
        raise _refuse(owner, name, value, "True or False", "True")
    return value


def check_guard(*, strict: Any, event_capacity: Any, holder_search_seconds: Any, redact: Any, growth_alpha: Any,
                reuse_window: Any, reuse_seconds: Any, retention_sampling: Any) -> None:
    """Refuse a wrong `Guard` argument (`UsageError`, one line naming it and the fix)."""
    for name, flag in (("strict", strict), ("redact", redact), ("retention_sampling", retention_sampling)):
        check_flag("Guard", name, flag)
    check_int("Guard", "event_capacity", event_capacity, minimum=1, example=65_536)
    check_int("Guard", "reuse_window", reuse_window, minimum=1, example=100)
    check_real("Guard", "holder_search_seconds", holder_search_seconds, low=0, example=120)
    check_real("Guard", "reuse_seconds", reuse_seconds, low=0, example=60)
    check_real("Guard", "growth_alpha", growth_alpha, low=0, high=1, open_high=True, example=1e-5)
