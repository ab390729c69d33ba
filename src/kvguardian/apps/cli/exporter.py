"""``kv-guardian exporter``: serve kv-guardian's metrics standalone, from the JSON reports other commands write.

A batch job (``kv-guardian redis scan --json > scan.json``, a nightly ``repro``, a CI run) writes a report;
the exporter serves its findings as ``kvguardian_findings`` and re-reads each file when it changes. To export
a running program's ledger, call ``kvguardian.core.exporters.server.start_exporter(guard)`` inside it instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvguardian.apps.cli.options import add_duration_option
from kvguardian.apps.cli.signals import stopping
from kvguardian.apps.cli.web_options import add_web_config, web_config
from kvguardian.core.errors import EXIT_OK, UsageError, require
from kvguardian.core.findings import Finding, Report
from kvguardian.core.input_file import MAX_DOCUMENT_BYTES, read_input
from kvguardian.core.report.escape import visible

NAME = "exporter"
HELP = "serve kv-guardian's Prometheus metrics (findings of JSON reports) on 127.0.0.1:9464"
EXAMPLE = "kv-guardian exporter --report scan.json --port 9464"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 to expose it)")
    p.add_argument("--port", type=int, default=9464, help="TCP port (default 9464; 0 picks a free one)")
    p.add_argument("--report", action="append", default=[], metavar="FILE",
                   help="a kv-guardian JSON report whose findings are exported, re-read when it changes "
                        "(repeatable)")
    p.add_argument("--once", action="store_true", help="print the metrics once to stdout and exit")
    add_duration_option(p)
    add_web_config(p)


def parse_document(text: str, where: str) -> Report:
    """The findings of one report file: a kv-guardian `Report` (``"schema": 1, "tool": "kv-guardian"``, as
    ``run --report``, ``watch --json`` and ``redis diff --json`` write) or a Redis scan
    (``"schema": "kv-guardian/redis-scan"``), with the time it was made.

    Raises:
        UsageError: anything else (another JSON document, a damaged one), naming ``where`` and the fix.
    """
    from kvguardian.core.findings import SCHEMA_VERSION
    from kvguardian.keyspace.result import SCHEMA as SCAN_SCHEMA
    from kvguardian.keyspace.result import ScanResult

    def refuse(what: str) -> UsageError:
        return UsageError(f"{where}: cannot read a kv-guardian JSON report: {what}; fix: pass a file written by a "
                          "kv-guardian command with --json or --report")

    try:
        data = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:
        raise refuse(f"not JSON ({str(exc)[:120]})") from None
    if isinstance(data, dict) and data.get("schema") == SCAN_SCHEMA:
        return ScanResult.from_dict(data, where=where).report()
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_VERSION or data.get("tool") != "kv-guardian":
        raise refuse(f"it is not a kv-guardian report (no \"schema\": {SCHEMA_VERSION}, \"tool\": \"kv-guardian\")")
    created, findings = data.get("created"), data.get("findings")
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not 0 < created < 1e11:
        raise refuse(f"\"created\" must be the Unix time of the report, got {str(created)[:40]!r}")
    if not isinstance(findings, list):
        raise refuse("\"findings\" must be a list")
    try:
        return Report(findings=[Finding.from_dict(f) for f in findings], created=float(created))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise refuse(f"a damaged finding ({type(exc).__name__}: {str(exc)[:120]})") from None


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


class ReportFiles:
    """The findings of a set of JSON report files, re-read when a file changes (modification time or size).

    Every file is checked when the exporter starts (a bad one is refused with one line). A file that turns
    bad later — half-written, deleted, rewritten as ``null`` or as another document — keeps its last good
    content, so ``kvguardian_findings`` never drops to nothing (which would resolve the alerts); the error is
    passed to `on_error` (counted, the scrape still answers)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = [Path(p) for p in paths]
        self._cache: dict[Path, tuple[tuple[int, int], Report]] = {}
        self._lock = threading.Lock()
        self.on_error: Callable[[str, BaseException], None] | None = None  # gets (file name, error)
        for path in self.paths:  # bad input is refused up front, with one line naming the file
            self._load(path, f"--report {path}")

    def _load(self, path: Path, where: str) -> Report:
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            cached = self._cache.get(path)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            text = read_input(path, where, max_bytes=MAX_DOCUMENT_BYTES).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{where}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
        report = parse_document(text, where)
        self._cache[path] = (stamp, report)
        return report

    def read(self) -> tuple[list[Finding], float | None]:
        """All findings and the newest report time (last good content for a file that turned bad)."""
        with self._lock:
            findings: list[Finding] = []
            newest: float | None = None
            for path in self.paths:
                try:
                    report = self._load(path, f"--report {path.name}")
                except UsageError as exc:
                    if self.on_error is not None:
                        self.on_error(path.name, exc)
                    report = self._cache[path][1]  # loaded once at start, so a last good copy exists
                findings.extend(report.findings)
                newest = report.created if newest is None else max(newest, report.created)
            return findings, newest


def run(args: argparse.Namespace) -> int:
    require("prometheus_client", "prometheus")
    from prometheus_client import CollectorRegistry, generate_latest

    from kvguardian.core.exporters.prometheus import KVGuardianCollector
    from kvguardian.core.exporters.server import start_exporter

    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port; fix: use 0-65535 (0 picks a free one)")
    if args.duration is not None and not 0 < args.duration < float("inf"):
        raise UsageError(f"--duration {args.duration} must be a number of seconds > 0")
    web = web_config(args)
    files = ReportFiles(args.report)
    collector = KVGuardianCollector(findings=files.read)
    files.on_error = lambda name, exc: collector.note_source_error(
        "findings", ValueError(f"{exc}; its last good content is still served"), traceback=False)
    if args.once:
        registry = CollectorRegistry(auto_describe=True)
        registry.register(collector)
        sys.stdout.write(generate_latest(registry).decode())
        return EXIT_OK
    exporter = start_exporter(collector=collector, host=args.host, port=args.port, check_interval=None,
                              web_config=web)
    stop = threading.Event()
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        with stopping(stop.set):  # SIGINT, SIGTERM and SIGHUP stop serving
            sys.stderr.write(visible(f"kv-guardian exporter: serving {exporter.url} ({len(files.paths)} report "
                                     "file(s)); Ctrl-C to stop") + "\n")
            sys.stderr.flush()
            while not stop.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                stop.wait(1.0 if left is None else min(left, 1.0))
    finally:
        exporter.close()
    return EXIT_OK
