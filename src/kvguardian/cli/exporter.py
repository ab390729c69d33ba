"""``kv-guardian exporter``: serve kv-guardian's metrics standalone, from the JSON reports other commands write.

A batch job (``kv-guardian redis scan --json > scan.json``, a nightly ``repro``, a CI run) writes a report;
the exporter serves its findings as ``kvguardian_findings`` and re-reads each file when it changes. To export
a running program's ledger, call ``kvguardian.exporters.server.start_exporter(guard)`` inside it instead.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvguardian._errors import EXIT_OK, UsageError, require
from kvguardian.cli.web_options import add_web_config, web_config
from kvguardian.findings import Finding, Report

NAME = "exporter"
HELP = "serve kv-guardian's Prometheus metrics (findings of JSON reports) on 127.0.0.1:9464"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 to expose it)")
    p.add_argument("--port", type=int, default=9464, help="TCP port (default 9464; 0 picks a free one)")
    p.add_argument("--report", action="append", default=[], metavar="FILE",
                   help="a kv-guardian JSON report whose findings are exported, re-read when it changes "
                        "(repeatable)")
    p.add_argument("--once", action="store_true", help="print the metrics once to stdout and exit")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    add_web_config(p)


class ReportFiles:
    """The findings of a set of JSON report files, re-read when a file's modification time changes."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = [Path(p) for p in paths]
        self._cache: dict[Path, tuple[float, Report]] = {}
        self._lock = threading.Lock()
        self.on_error: Callable[[str, BaseException], None] | None = None  # gets (file name, error)
        for path in self.paths:  # bad input is refused up front, with one line naming the file
            try:
                self._load(path)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise UsageError(f"--report {path}: cannot read a kv-guardian JSON report ({exc}); fix: pass a "
                                 "file written by a kv-guardian command with --json") from None

    def _load(self, path: Path) -> Report:
        mtime = path.stat().st_mtime
        cached = self._cache.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        report = Report.from_json(path.read_text())
        self._cache[path] = (mtime, report)
        return report

    def read(self) -> tuple[list[Finding], float | None]:
        """All findings and the newest report time. A file that turned bad (half-written, deleted) keeps its
        last good content, and the error is reported to `on_error` (counted, the scrape still answers)."""
        with self._lock:
            findings: list[Finding] = []
            newest: float | None = None
            for path in self.paths:
                try:
                    report = self._load(path)
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    if self.on_error is not None:
                        self.on_error(path.name, exc)
                    report = self._cache[path][1]  # loaded once at start, so a last good copy exists
                findings.extend(report.findings)
                newest = report.created if newest is None else max(newest, report.created)
            return findings, newest


def run(args: argparse.Namespace) -> int:
    require("prometheus_client", "prometheus")
    from prometheus_client import CollectorRegistry, generate_latest

    from kvguardian.exporters.prometheus import KVGuardianCollector
    from kvguardian.exporters.server import start_exporter

    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port; fix: use 0-65535 (0 picks a free one)")
    web = web_config(args)
    files = ReportFiles(args.report)
    collector = KVGuardianCollector(findings=files.read)
    files.on_error = lambda name, exc: collector.note_source_error(
        "findings", ValueError(f"--report {name}: {exc}; its last good content is still served"), traceback=False)
    if args.once:
        registry = CollectorRegistry(auto_describe=True)
        registry.register(collector)
        sys.stdout.write(generate_latest(registry).decode())
        return EXIT_OK
    exporter = start_exporter(collector=collector, host=args.host, port=args.port, check_interval=None,
                              web_config=web)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sys.stderr.write(f"kv-guardian exporter: serving {exporter.url} ({len(files.paths)} report file(s)); "
                     f"Ctrl-C to stop\n")
    sys.stderr.flush()
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        while not stop.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            stop.wait(1.0 if left is None else min(left, 1.0))
    except KeyboardInterrupt:
        pass
    finally:
        exporter.close()
    return EXIT_OK
