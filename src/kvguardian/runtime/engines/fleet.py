"""One watch over several replicas: a `Watch` per replica (its own scrapes, KV-event socket, sequence numbers,
replay and finding board) run side by side, every finding, warning and summary named by its replica.

Replicas share nothing, so a sequence gap, a partial replay or a publisher restart on one replica's stream
touches only that replica's prefix index. The replica's name is its metrics ``host:port`` and its model the
``model_name`` its engine reports; the exporter (`watch_exporter.FleetCollector`) puts both on every series.
Example: docs/design/engines.md ("Many replicas").
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Finding, Report
from kvguardian.runtime.engines.watch import Watch

__all__ = ["Fleet", "attributed"]


def attributed(finding: Finding, watch: Watch) -> Finding:
    """A copy of a replica's finding that names the replica (message and evidence); the board keeps its own."""
    return dataclasses.replace(
        finding, message=f"{watch.replica}: {finding.message}",
        evidence={**finding.evidence, "replica": watch.replica, "model_name": watch.model_name})


class Fleet:
    """Watches of several replicas, run in one thread each; `run`, `stop`, `report` as a single `Watch`."""

    def __init__(self, watches: Sequence[Watch]) -> None:
        seen: set[str] = set()
        for w in watches:
            if w.replica in seen:
                raise UsageError(f"--metrics names replica {w.replica} twice; fix: give each replica once")
            seen.add(w.replica)
        self.watches = list(watches)
        self.engine = self.watches[0].engine if self.watches else ""
        self._errors: list[Exception] = []
        self._on_warning: Callable[[str], None] | None = None

    @property
    def on_warning(self) -> Callable[[str], None] | None:
        return self._on_warning

    @on_warning.setter
    def on_warning(self, callback: Callable[[str], None] | None) -> None:
        """Each replica's warnings go to ``callback``, prefixed with the replica."""
        self._on_warning = callback
        for w in self.watches:
            w.on_warning = None if callback is None else (lambda line, w=w: callback(f"{w.replica}: {line}"))

    def run(self, duration: float | None = None, on_new: Callable[[list[Finding]], None] | None = None) -> None:
        """Watch every replica until ``duration`` seconds have passed (None: until `stop`). A usage error in
        one replica's watch (a page that is not the engine's metrics) stops them all and is raised here."""
        threads = [threading.Thread(target=self._run_one, args=(w, duration), name=f"kvg-watch-{w.replica}",
                                    daemon=True) for w in self.watches]
        for t in threads:
            t.start()
        try:
            while alive := [t for t in threads if t.is_alive()]:
                alive[0].join(0.25)
                if on_new is not None and (new := self.take_new()):
                    on_new(new)
        finally:
            self.stop()
            for t in threads:
                t.join()
        if self._errors:
            raise self._errors[0]

    def _run_one(self, watch: Watch, duration: float | None) -> None:
        try:
            watch.run(duration=duration)
        except Exception as exc:  # handed to the caller's thread by `run`
            self._errors.append(exc)
            self.stop()

    def take_new(self) -> list[Finding]:
        return [attributed(f, w) for w in self.watches for f in w.board.take_new()]

    def stop(self) -> None:
        for w in self.watches:
            w.stop()

    def close(self) -> None:
        for w in self.watches:
            w.close()

    # ------------------------------------------------------------------ reading
    def incomplete(self) -> bool:
        return any(w.incomplete() for w in self.watches)

    def report(self) -> Report:
        """Every replica's findings (named by replica) and summary, in the order the replicas were given."""
        reports = [(w, w.report()) for w in self.watches]
        findings = [attributed(f, w) for w, r in reports for f in r.findings]
        replicas = [{"replica": w.replica, "model_name": w.model_name, **r.summary} for w, r in reports]
        summary: dict[str, Any] = {
            "engine": self.engine,
            "replicas": replicas,
            "scrapes": sum(w.scrapes for w in self.watches),
            "incomplete": self.incomplete(),
            "warnings": [f"{w.replica}: {line}" for w in self.watches for line in w.warnings],
        }
        return Report(findings=findings, summary=summary)

    def summary_lines(self) -> list[str]:
        """Each replica's summary lines, prefixed with the replica and its model."""
        return [f"{w.replica} ({w.model_name or 'model unknown'}): {line}"
                for w in self.watches for line in w.summary_lines()]
