"""What every memory signal reports: bytes used, the limit they count against, and where they came from.

A signal is read-only: `Signal.read` looks at a counter somewhere (a cgroup file, the CUDA driver, NVML, a
paged pool, the ledger) and returns a `Reading`. It never raises for a failed read: the reading carries the
error instead, so the guard keeps the other signals and says in its metrics which one it could not read
(fail-open). Bad configuration (a path that is not a cgroup, NVML absent) is refused when the signal is built,
with `SignalUnavailable`: one line naming what, where and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError

__all__ = ["Reading", "Signal", "SignalUnavailable", "failed"]


class SignalUnavailable(UsageError):
    """A signal cannot be built here (no such cgroup, no CUDA, no NVML): the message says why and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=EXIT_ENVIRONMENT)


@dataclass(frozen=True)
class Reading:
    """One read of one signal."""

    signal: str  # the label in metrics: "cgroup", "cuda:0", "nvml:0", "pool:main", "kv_budget"
    used: int | None  # what counts against the limit (bytes, or blocks when ``unit`` says so)
    limit: int | None  # None: no limit is set (an unlimited cgroup)
    source: str  # where it was read: a path, "torch.cuda", "nvml", a pool's name
    unit: str = "bytes"
    error: str | None = None  # why it could not be read (then used and limit are None)
    extra: Mapping[str, float] = field(default_factory=dict)  # e.g. oom_kill, reserved, allocated

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ratio(self) -> float | None:
        """used / limit, or None when either is unknown or there is no limit."""
        if self.used is None or not self.limit:
            return None
        return self.used / self.limit

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"signal": self.signal, "used": self.used, "limit": self.limit,
                                  "ratio": self.ratio, "unit": self.unit, "source": self.source}
        if self.error is not None:
            out["error"] = self.error
        if self.extra:
            out["extra"] = dict(self.extra)
        return out


def failed(signal: str, source: str, exc: BaseException, unit: str = "bytes") -> Reading:
    """The reading of a signal whose read raised ``exc``."""
    return Reading(signal, None, None, source, unit, error=f"{type(exc).__name__}: {exc}")


@runtime_checkable
class Signal(Protocol):
    """A read-only memory signal. ``fast`` signals are O(1) without system calls (cheap on every allocation)."""

    name: str
    fast: bool

    def read(self) -> Reading: ...
