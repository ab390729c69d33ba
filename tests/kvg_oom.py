"""A memory signal whose value the test sets (for the pre-OOM guard's tests)."""

from __future__ import annotations

from kvguardian.ops.oom.signals.base import Reading


class Knob:
    fast = False

    def __init__(self, name: str = "cgroup", used: int = 0, limit: int = 1000, extra: dict | None = None) -> None:
        self.name, self.used, self.limit, self.extra = name, used, limit, extra or {}
        self.error: str | None = None

    def read(self) -> Reading:
        if self.error:
            return Reading(self.name, None, None, "knob", error=self.error)
        return Reading(self.name, self.used, self.limit, "knob", extra=self.extra)
