"""Where the vLLM audit's findings and pool metrics go: stderr lines, a JSON report, Prometheus.

Each new finding is one stderr line (at most ``_MAX_LINES``); ``KVG_VLLM_AUDIT_REPORT=FILE`` keeps a JSON report
rewritten atomically (under ``kv-guardian run`` it goes into the run's folder); ``KVG_VLLM_AUDIT_PORT`` serves
metrics from the engine core. All of it runs in one daemon thread; the engine thread only bumps a counter.
Details: docs/design/engines.md.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from kvguardian.core.findings import Finding, Report
from kvguardian.core.report.output import write_whole
from kvguardian.runtime.engines.vllm_plugin.hooks import AuditedScheduler, say

__all__ = ["AuditSink"]

_MAX_LINES = 50
_WRITE_EVERY = 1.0


class _PoolView:
    """The pool as `kvguardian.core.exporters.prometheus.PoolMetrics` wants it (last full audit)."""

    def __init__(self, owner: AuditedScheduler) -> None:
        self._owner = owner

    def metrics(self) -> dict[str, float]:
        m = dict(self._owner.audit.metrics)
        if not m:
            raise LookupError("no full audit yet")
        return m


class _AuditCollector:
    """``kvguardian_vllm_audit_*``: how much auditing ran and whether it degraded."""

    def __init__(self, owner: AuditedScheduler) -> None:
        self._owner = owner

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[Any]:
        from kvguardian.core.exporters.prometheus import family

        a = self._owner.audit
        for name, value in (
            ("kvguardian_vllm_audit_checks_total", a.audits),
            ("kvguardian_vllm_audit_seconds_total", a.audit_seconds),
            ("kvguardian_vllm_audit_errors_total", self._owner.wrapper_errors),
            ("kvguardian_vllm_audit_enabled", 1.0 if self._owner.enabled else 0.0),
            ("kvguardian_vllm_lost_free_requests", len(a.lost_requests)),
            ("kvguardian_vllm_blocks_lost", a.metrics.get("blocks_lost", 0)),
        ):
            fam = family(name)
            fam.add_metric([], float(value))
            yield fam


class AuditSink:
    """Reports one audited scheduler: starts its thread (and exporter) on creation; `close` at exit."""

    def __init__(self, owner: AuditedScheduler, *, report_path: str | None = None, run_dir: str | None = None,
                 port: int | None = None, host: str = "127.0.0.1", label: dict[str, Any] | None = None) -> None:
        self.owner = owner
        self.label = label or {}
        self.run_dir = run_dir
        self.report_path = report_path.replace("{pid}", str(os.getpid())) if report_path else None
        if run_dir:
            self.report_path = os.path.join(run_dir, f"report-{os.getpid()}.json")
        self._lines = 0
        self._seen_changes = -1
        self._stop = threading.Event()
        self.exporter: Any = None
        self.exporter_error: str | None = None
        if port is not None:
            self._serve(host, port)
        self._thread = threading.Thread(target=self._loop, name="kvguardian-vllm-audit", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:  # the engine core is a multiprocessing child: it ends with os._exit, no atexit
            mp_util.Finalize(None, self.close, exitpriority=-100)

    def _serve(self, host: str, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry

            from kvguardian.core.exporters.prometheus import KVGuardianCollector
            from kvguardian.core.exporters.server import start_exporter

            board, audit = self.owner.audit.board, self.owner.audit
            collector = KVGuardianCollector(pools={"vllm": _PoolView(self.owner)},
                                            findings=lambda: (board.active(), audit.last_audit_time))
            registry = CollectorRegistry(auto_describe=True)
            registry.register(_AuditCollector(self.owner))
            self.exporter = start_exporter(collector=collector, registry=registry, host=host, port=port,
                                           check_interval=None)
        except Exception as exc:  # a taken port must not stop vLLM: say so once, keep auditing
            self.exporter_error = str(exc)
            say(f"metrics not served on {host}:{port} ({exc})")

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while not self._stop.wait(_WRITE_EVERY):
            self.owner.quiet_audit()  # the engine waits for work: audit the state it left
            self.flush()

    def flush(self) -> None:
        """Print new findings and rewrite the report if anything changed (never raises)."""
        try:
            changes = self.owner.changes + self.owner.audit.audits
            if changes == self._seen_changes:
                return
            self._seen_changes = changes
            self._print_new(self.owner.audit.board.take_new())
            if self.report_path:
                self._write()
        except Exception as exc:  # fail open: reporting trouble never reaches vLLM
            if self._lines < _MAX_LINES:
                self._lines += 1
                say(f"reporting failed ({type(exc).__name__}: {exc})")

    def _print_new(self, findings: list[Finding]) -> None:
        for f in findings:
            self._lines += 1
            if self._lines <= _MAX_LINES:
                say(f"{f.id} {f.name} ({f.severity.value}) {f.message}")
            elif self._lines == _MAX_LINES + 1:
                say("more findings are not printed" + (f"; see {self.report_path}" if self.report_path else ""))

    def report(self) -> Report:
        summary = {"engine": "vllm", "process": "engine-core", "pid": os.getpid(), **self.label,
                   "audit_enabled": self.owner.enabled, "wrapper_errors": self.owner.wrapper_errors,
                   "first_wrapper_error": self.owner.first_error,
                   "metrics_url": self.exporter.url if self.exporter is not None else None,
                   **self.owner.audit.summary()}
        return Report(findings=self.owner.audit.board.all(), summary=summary)

    def _write(self) -> None:
        assert self.report_path is not None
        report = self.report()
        if self.run_dir:  # the format of `kv-guardian run`'s per-process reports
            s = report.summary
            text = json.dumps({
                "pid": os.getpid(), "argv": list(sys.argv), "status": "vllm-audit",
                "final": self._stop.is_set(),  # False: streamed while running (the process may be killed)
                "message": (f"vLLM engine core: {s['audits']} audit(s), {s['requests_finished']} request(s) "
                            f"freed, {len(s['lost_free_requests'])} with a lost free"),
                "report": {**report.to_dict(), "summary": {}}, "vllm_audit": s,
            }, default=str)
        else:
            text = report.to_json()
        write_whole(self.report_path, text)  # a user's report path may be a link or /dev/stdout

    def close(self) -> None:
        """Final report (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._seen_changes = -1
        self.flush()
        if self.exporter is not None:
            try:
                self.exporter.close()
            except Exception:
                pass

