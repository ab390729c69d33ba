"""``kv-guardian redis scan|rdb|diff|exporter``: the Redis key-space leak analyzer (the article's chapter 1).

Works without torch: ``pip install 'kv-guardian[redis]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvguardian.apps.cli.options import add_format, add_hidden_alias, add_output, add_subcommands, example
from kvguardian.apps.cli.signals import Ending, interrupting, stopping
from kvguardian.apps.cli.web_options import add_web_config, web_config
from kvguardian.core.errors import EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE, UsageError
from kvguardian.core.findings import Report, Severity
from kvguardian.core.report.escape import visible
from kvguardian.core.report.output import add_html_option, check_outputs
from kvguardian.core.report.reporter import reporting

if TYPE_CHECKING:
    from kvguardian.keyspace.result import ScanResult

NAME = "redis"
HELP = "find key-space leaks in Redis: read-only scans or RDB snapshots, key patterns, no-TTL/cold verdicts, diffs"
EXAMPLE = "kv-guardian redis scan redis://127.0.0.1:6379 --json -o today.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = add_subcommands(p, "redis_command", "SUBCOMMAND")
    scan = sub.add_parser("scan", help="scan a Redis (or Cluster) read-only and report per-pattern leaks",
                          description="Scan a Redis or Redis Cluster read-only (SCAN + one read-only Lua call per "
                                      "batch) and report key patterns, TTL and idle-time distributions, and leaks.",
                          epilog=example("kv-guardian redis scan redis://127.0.0.1:6379/0 --json -o today.json",
                                         "kv-guardian redis scan redis://127.0.0.1:6379/0 --compare yesterday.json"))
    scan.add_argument("url", help="redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://…, or unix:///path.sock "
                                  "(no password in the URL: $REDISCLI_AUTH, as for redis-cli); any node of a "
                                  "Redis Cluster: every shard is scanned, in parallel")
    _scan_arguments(scan)
    _replicas_argument(scan)
    _output_arguments(scan)
    scan.add_argument("--rdb", action="store_true",
                      help="read a snapshot through the replication handshake instead of probing keys (no server "
                           "CPU per key; the user needs +sync +replconf)")
    _verdict_arguments(scan)
    scan.set_defaults(redis_run=run_scan)

    from kvguardian.apps.cli.redis_rdb import ScanHooks, add_rdb_command

    add_rdb_command(sub, ScanHooks(_scan_arguments, _output_arguments, _verdict_arguments, _options, emit_scan))

    diff = sub.add_parser("diff", help="per-pattern growth between two scan JSON files (KVG303/KVG304)",
                          epilog=example("kv-guardian redis diff yesterday.json today.json"))
    diff.add_argument("old", metavar="OLD.json")
    diff.add_argument("new", metavar="NEW.json")
    add_format(diff, json_help="print rows and findings as JSON")
    add_html_option(diff)
    diff.add_argument("--top", type=int, default=20, help="patterns shown in the table (default 20)")
    _verdict_arguments(diff)
    diff.set_defaults(redis_run=run_diff)

    exp = sub.add_parser("exporter", help="serve /metrics: O(1) INFO gauges per scrape + the last completed scan",
                         description="Serve Prometheus /metrics. Every scrape runs INFO keyspace/memory only; "
                                     "scans run on their own schedule, never inside a scrape.",
                         epilog=example("kv-guardian redis exporter redis://127.0.0.1:6379 --port 9464 --interval 15m"))
    exp.add_argument("url", help="redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://…, or unix:///path.sock")
    exp.add_argument("--port", type=int, default=9464, help="port to serve /metrics on (default 9464)")
    exp.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    add_hidden_alias(exp, "--addr", "host", metavar="HOST")  # its 0.1.0 name, accepted for one release
    exp.add_argument("--interval", default="5m", help="pause between scans (default 5m)")
    exp.add_argument("--top", type=int, default=50, help="patterns with their own label; the rest sum under {other}")
    _scan_arguments(exp)
    _replicas_argument(exp)
    exp.add_argument("--min-keys", type=int, default=10, help="keys a pattern needs for a finding (default 10)")
    add_web_config(exp)
    exp.set_defaults(redis_run=run_exporter)


def _output_arguments(p: argparse.ArgumentParser) -> None:
    add_format(p, json_help="print the result as JSON (the schema redis diff reads)")
    add_output(p, "also write the JSON result to FILE")
    add_html_option(p)
    p.add_argument("--prometheus", metavar="FILE", help="write the Prometheus exposition to FILE ('-': stdout)")
    p.add_argument("--compare", metavar="OLD.json", help="also report growth against an earlier scan")
    p.add_argument("--top", type=int, default=20, help="patterns shown in the table (default 20)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _scan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=0,
                   help="keys per SCAN COUNT and probe call; 0 (default): adapt so no call exceeds --max-call-ms")
    p.add_argument("--max-call-ms", type=float, default=0.5,
                   help="with --batch 0: the longest one probe call may hold the server (default 0.5 ms)")
    p.add_argument("--nice", type=int, default=10,
                   help="run the scan's mining and statistics this much nicer, in a child process (default 10; "
                   "0: off, all in this process)")
    p.add_argument("--max-keys-per-sec", type=float, default=None, help="rate limit for the whole scan")
    p.add_argument("--sample", type=int, default=None, metavar="N", help="stop after N keys (a quick look)")
    p.add_argument("--match", default=None, metavar="GLOB", help="only keys matching this SCAN MATCH glob")
    p.add_argument("--mode", choices=("auto", "lua", "pipeline"), default="auto",
                   help="probe with one read-only Lua call per batch (lua), a pipeline, or pick (auto)")
    p.add_argument("--cold-after", default="7d", help="idle time that makes a no-TTL key cold (default 7d)")
    p.add_argument("--cold-freq", type=int, default=0, help="under an LFU policy: counter at or below = cold")
    p.add_argument("--max-patterns", type=int, default=500, help="cap on patterns; the rest go to {other}")
    p.add_argument("--collapse-after", type=int, default=20,
                   help="distinct literals at one position before it becomes a placeholder (default 20)")
    p.add_argument("--timeout", type=float, default=10.0, help="socket timeout in seconds (default 10)")
    p.add_argument("--redact", action="store_true", help="replace key-name literals with stable hashes everywhere")


def _replicas_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", "--read-from-replicas", dest="replicas", action="store_true",
                   help="Redis Cluster: read each shard's replica (READONLY) instead of its master; a shard "
                        "without a healthy replica is not read")


def _verdict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-keys", type=int, default=10, help="keys a pattern needs for a finding (default 10)")
    p.add_argument("--fail-on", default="error", choices=("error", "warning", "info", "never"),
                   help="exit 1 when a finding reaches this severity (default error)")


def run(args: argparse.Namespace) -> int:
    return int(args.redis_run(args))


def _options(args: argparse.Namespace) -> Any:
    from kvguardian.keyspace.scan import ScanOptions, parse_duration

    opts = ScanOptions(batch=args.batch, max_call_ms=args.max_call_ms, nice=args.nice,
                        max_keys_per_sec=args.max_keys_per_sec, sample=args.sample, mode=args.mode,
                        cold_after=parse_duration(args.cold_after, "--cold-after"), cold_freq=args.cold_freq,
                        max_patterns=args.max_patterns, collapse_after=args.collapse_after, match=args.match,
                        timeout=args.timeout, replicas=getattr(args, "replicas", False))
    opts.check()
    for flag, value, low in (("--top", args.top, 1), ("--min-keys", args.min_keys, 0)):
        if value < low:
            raise UsageError(f"{flag} {value} must be >= {low}")
    # checked before the scan, so a finished scan is never thrown away for a bad path, nor its input replaced
    check_outputs([(flag, getattr(args, name, None)) for flag, name in (
        ("--output", "output"), ("--prometheus", "prometheus"), ("--html", "html"))],
        [*[("the RDB file read", f) for f in getattr(args, "file", None) or []],
         ("the scan compared with (--compare)", getattr(args, "compare", None))])
    return opts


def _finalize(args: argparse.Namespace) -> Callable[[ScanResult], ScanResult]:
    from kvguardian.keyspace.redact import redact_result
    from kvguardian.keyspace.verdicts import Thresholds, scan_findings

    def finalize(result: ScanResult) -> ScanResult:
        if args.redact:
            result = redact_result(result)
        result.findings = scan_findings(result, Thresholds(min_keys=args.min_keys))
        return result

    return finalize


def _exit_code(report: Report, fail_on: str) -> int:
    return EXIT_OK if fail_on == "never" else report.exit_code(Severity.parse(fail_on))


def run_scan(args: argparse.Namespace) -> int:
    from kvguardian.keyspace.render import progress_bar
    from kvguardian.keyspace.result import load_result
    from kvguardian.keyspace.scan import scan

    opts = _options(args)
    if args.rdb and args.replicas:
        raise UsageError("--rdb and --replicas: a snapshot comes from the one node of the URL; fix: drop --replicas "
                         "and give a replica's URL, or read one dump per shard with: kv-guardian redis rdb FILE…")
    old = load_result(args.compare) if args.compare else None  # a bad file fails before the scan
    with interrupting() as ending:  # SIGTERM and SIGHUP end the scan as Ctrl-C does, with a partial result
        if args.rdb:
            from kvguardian.apps.cli.redis_rdb import run_scan_rdb

            return run_scan_rdb(args, opts, old, functools.partial(emit_scan, ending=ending))
        show_progress = not args.no_progress and sys.stderr.isatty()
        with progress_bar(show_progress) as progress:
            result = scan(args.url, opts, progress=progress, stop=threading.Event())
    return emit_scan(args, result, old, command="scan", ending=ending)


def emit_scan(args: argparse.Namespace, result: ScanResult, old: ScanResult | None, *, command: str,
              ending: Ending | None = None) -> int:
    """Findings, outputs and the exit code of a finished scan (live or from an RDB)."""
    result = _finalize(args)(result)
    diff_out = _compare(args, old, result) if old is not None else None
    failed = []  # a file that cannot be written loses nothing else: the table, the page, the other files
    if args.output:
        failed.append(_write(args.output, result.to_json() + "\n", "-o"))
    if args.prometheus:
        from kvguardian.keyspace.metrics import exposition

        failed.append(_write(args.prometheus, exposition(result), "--prometheus"))
    if args.format == "json" or args.prometheus != "-":
        _show(args, result, diff_out)
    elif args.html:  # the exposition is on stdout: the HTML report alone
        _show(args, result, diff_out, html_only=True)
    code = _scan_exit(args, result, command, ending or Ending())
    if any(failed):
        raise UsageError("; ".join(f for f in failed if f) + "; the result was still shown; fix: free space or "
                         "write elsewhere", exit_code=EXIT_ENVIRONMENT)
    return code


def _compare(args: argparse.Namespace, old: ScanResult, result: ScanResult) -> tuple[Any, Any, Any]:
    from kvguardian.keyspace.verdicts import Thresholds, diff

    rows, growth, warnings = diff(old, result, Thresholds(min_keys=args.min_keys))
    result.findings.extend(growth)
    return rows, growth, warnings


def _show(args: argparse.Namespace, result: ScanResult, diff_out: tuple[Any, Any, Any] | None, *,
          html_only: bool = False) -> None:
    from kvguardian.keyspace.render import print_diff, print_scan

    if html_only:
        from kvguardian.core.report.html.reporter import html_file  # the HTML page's modules load only for it

    with (contextlib.closing(html_file(args.html)) if html_only else
          reporting("json" if args.format == "json" else "console", html=args.html)) as out:
        print_scan(result, out, top=args.top)
        if diff_out is not None:
            print_diff(diff_out[0], Report(findings=diff_out[1]), diff_out[2], out, top=args.top)
        out.result(result.to_dict())


def _scan_exit(args: argparse.Namespace, result: ScanResult, command: str, ending: Ending) -> int:
    def say(text: str) -> None:
        sys.stderr.write(visible(f"kv-guardian redis {command}: {text}") + "\n")

    reason = result.incomplete_reason or ""
    if reason == "interrupted":
        name = signal.Signals(ending.signum or signal.SIGINT).name
        say(f"interrupted ({name}); the result above is partial (complete: false)")
        return ending.exit_code
    if reason.startswith(("connection lost", "damaged or truncated", "damaged RDB")):
        say(f"error: {reason}; the result above is partial (complete: false)")
        return EXIT_ENVIRONMENT if reason.startswith("connection lost") else EXIT_USAGE
    return _exit_code(result.report(), args.fail_on)


def run_diff(args: argparse.Namespace) -> int:
    from kvguardian.keyspace.render import print_diff
    from kvguardian.keyspace.result import load_result
    from kvguardian.keyspace.verdicts import Thresholds, diff

    check_outputs([("--html", args.html)], [("OLD", args.old), ("NEW", args.new)])
    old, new = load_result(args.old), load_result(args.new)
    rows, findings, warnings = diff(old, new, Thresholds(min_keys=args.min_keys))
    report = Report(findings=findings, summary={"old": args.old, "new": args.new})
    with reporting("json" if args.format == "json" else "console", html=args.html) as out:
        print_diff(rows, report, warnings, out, top=args.top)
        out.result({"rows": rows, "warnings": warnings, **report.to_dict()})
    return _exit_code(report, args.fail_on)


def run_exporter(args: argparse.Namespace) -> int:
    from kvguardian.keyspace.exporter import Exporter
    from kvguardian.keyspace.scan import parse_duration

    opts = _options(args)
    web = web_config(args)
    interval = parse_duration(args.interval, "--interval")
    if interval <= 0:
        raise UsageError(f"--interval {args.interval} must be > 0 (scans back to back would load the server); "
                         "fix: e.g. --interval 5m")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port; fix: use 0-65535 (0 picks a free one)")
    exporter = Exporter(args.url, opts, interval=interval, top=args.top, finalize=_finalize(args))
    try:
        host, port = exporter.serve(args.port, args.host, web_config=web)
    except OSError as exc:
        exporter.close()
        from kvguardian.core.exporters.http import bind_fix

        fix = bind_fix(exc, port_flag="--port", host_flag="--host")
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}; fix: {fix}",
                         exit_code=EXIT_ENVIRONMENT) from None
    done = threading.Event()
    try:
        with stopping(done.set):  # SIGINT, SIGTERM and SIGHUP stop serving
            exporter.start()
            sys.stderr.write(visible(f"kv-guardian redis exporter: serving {web.scheme}://{host}:{port}/metrics, "
                                     f"scanning every {interval:g} s") + "\n")
            sys.stderr.flush()
            while not done.wait(1.0):
                pass
    finally:
        exporter.close()
    return EXIT_OK


def _write(path: str, text: str, flag: str) -> str | None:
    """Write ``text`` to ``path`` ('-': stdout); what went wrong, or None."""
    if path == "-":
        sys.stdout.write(text)
        return None
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        return f"cannot write {flag} {path!r}: {exc.strerror or exc}"
    return None
