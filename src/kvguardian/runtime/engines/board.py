"""The findings of a watch: conditions that hold now (active) and those that held and went away (resolved).

A watcher raises a finding under a key (``("KVG207", "engine=0")``) every time it sees the condition and
resolves the key when the condition ends. The exporter shows active findings only, so alerts resolve; the
final report lists both, resolved ones with how long they lasted. Bounded: at most ``limit`` keys are kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from kvguardian.core.findings import Finding

__all__ = ["FindingBoard"]


class FindingBoard:
    """Active and resolved findings by key; thread-safe (the exporter reads it from its HTTP thread)."""

    def __init__(self, limit: int = 1_000) -> None:
        self._lock = threading.Lock()
        self._active: OrderedDict[Hashable, tuple[Finding, float]] = OrderedDict()  # key -> (finding, since)
        self._resolved: list[Finding] = []
        self._announced: set[Hashable] = set()
        self._limit = limit
        self.dropped = 0  # findings not kept because the board was full

    def raise_(self, key: Hashable, finding: Finding, now: float) -> None:
        """The condition holds: add the finding, or replace it with fresher evidence (keeping its start)."""
        with self._lock:
            prev = self._active.get(key)
            if prev is None and len(self._active) + len(self._resolved) >= self._limit:
                self.dropped += 1
                return
            self._active[key] = (finding, prev[1] if prev is not None else now)

    def resolve(self, key: Hashable, now: float) -> None:
        """The condition ended: move the finding to the resolved list with its duration."""
        with self._lock:
            item = self._active.pop(key, None)
            if item is None:
                return
            finding, since = item
            finding.evidence["resolved_after_seconds"] = round(now - since, 3)
            self._resolved.append(finding)
            self._announced.discard(key)

    def is_active(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._active

    def active(self) -> list[Finding]:
        with self._lock:
            return [f for f, _ in self._active.values()]

    def all(self) -> list[Finding]:
        """Resolved findings first (in order), then the active ones."""
        with self._lock:
            return [*self._resolved, *(f for f, _ in self._active.values())]

    def take_new(self) -> list[Finding]:
        """Active findings not returned by a previous call (for printing them as they appear)."""
        with self._lock:
            new = [(k, f) for k, (f, _) in self._active.items() if k not in self._announced]
            self._announced.update(k for k, _ in new)
            return [f for _, f in new]
