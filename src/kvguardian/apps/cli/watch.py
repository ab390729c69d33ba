"""``kv-guardian watch vllm|sglang``: check a live inference server from the outside (metrics, KV events)."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from kvguardian.apps.cli.options import add_format, add_subcommands, example
from kvguardian.apps.cli.signals import stopping
from kvguardian.apps.cli.web_options import add_web_config, web_config
from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError
from kvguardian.core.findings import Finding, Severity
from kvguardian.core.report.console import ConsoleReporter
from kvguardian.core.report.output import add_html_option, check_writable
from kvguardian.core.report.reporter import Reporter, make_reporter

if TYPE_CHECKING:
    from kvguardian.core.exporters.server import Exporter
    from kvguardian.core.exporters.webconfig import WebConfig
    from kvguardian.core.findings import Report
    from kvguardian.runtime.engines.fleet import Fleet
    from kvguardian.runtime.engines.watch import Watch

NAME = "watch"
HELP = "watch a live vLLM or SGLang server for KV leaks from its metrics and (vLLM) its KV-event stream"
EXAMPLE = "kv-guardian watch vllm --metrics http://127.0.0.1:8000/metrics --events tcp://127.0.0.1:5557"


def _positive(kind: type, *, zero: bool = False) -> Any:
    """An argparse type: a finite number > 0 (>= 0 with ``zero``)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value >= 0 if zero else value > 0) or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be {'>=' if zero else '>'} 0 (a finite number)")
        return value

    return parse


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics", required=True, action="append", metavar="URL",
                   help="the server's Prometheus endpoint (…/metrics); repeat it to watch several replicas at once "
                        "(findings and exported series then name each replica)")
    add_html_option(p)
    p.add_argument("--interval", type=_positive(float), default=5.0, metavar="S",
                   help="seconds between scrapes (default 5)")
    p.add_argument("--grace", type=_positive(float, zero=True), default=60.0, metavar="S",
                   help="seconds a suspicious idle state must last before it is a finding (default 60)")
    p.add_argument("--duration", type=_positive(float), default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C or SIGTERM)")
    p.add_argument("--timeout", type=_positive(float), default=5.0, metavar="S",
                   help="HTTP timeout of a scrape (default 5)")
    add_format(p, json_help="print the final report as JSON (no live lines)")
    p.add_argument("--fail-on", default="error", choices=[s.value for s in Severity],
                   help="exit 1 when a finding reaches this severity (default error)")
    p.add_argument("--exporter-port", type=int, default=None, metavar="PORT",
                   help="also serve findings and watch metrics for Prometheus on this port (0: pick one)")
    p.add_argument("--exporter-host", default="127.0.0.1", metavar="HOST",
                   help="bind address of --exporter-port (default 127.0.0.1)")
    add_web_config(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = add_subcommands(p, "engine", "ENGINE")
    v = sub.add_parser("vllm", help="vLLM: KV usage while idle; prefix-index audit from KV events",
                       description="Watch a vLLM server: KV usage while idle (KVG207) from --metrics, and with "
                                   "--events the prefix-cache index (KVG208, KVG105) with gap repair (KVG209).",
                       epilog=example(EXAMPLE + " --replay tcp://127.0.0.1:5558 --exporter-port 9465"))
    _common(v)
    v.add_argument("--events", action="append", metavar="tcp://HOST:5557",
                   help="vLLM's KV-event publisher (ZMQ PUB), connected to; vLLM's own bind form tcp://*:P "
                        "connects to the --metrics host; ipc://PATH as given. With several --metrics: one "
                        "--events per --metrics, in the same order")
    v.add_argument("--events-bind", action="append", nargs="?", const="*", metavar="ENDPOINT",
                   help="bind --events instead (for a vLLM endpoint tcp://HOST:P with a concrete host, which "
                        "makes vLLM connect to it); with ENDPOINT (repeatable) bind only that --events, for a "
                        "fleet whose replicas publish both ways")
    v.add_argument("--replay", action="append", metavar="tcp://HOST:5558",
                   help="vLLM's KV-event replay socket (ZMQ ROUTER, always bound by vLLM); one per --events, "
                        "in the same order")
    v.add_argument("--topic", default="", help="KV-event topic to subscribe to (vLLM's default: empty)")
    v.add_argument("--num-blocks", type=_positive(int), default=None, metavar="N",
                   help="GPU blocks of the pool (default: num_gpu_blocks from vllm:cache_config_info)")
    v.add_argument("--index-limit", type=_positive(int), default=1_000_000, metavar="N",
                   help="most prefix blocks the audit indexes (bounds its memory; default 1,000,000)")
    v.add_argument("--max-salts-per-prefix", type=_positive(int), default=64, metavar="N",
                   help="one prompt prefix cached under this many cache salts is a finding (default 64)")
    s = sub.add_parser("sglang", help="SGLang: token conservation from its gauges",
                       description="Watch an SGLang server: available + evictable + used <= total always, and "
                                   "nothing used or unaccounted while idle (KVG206).",
                       epilog=example("kv-guardian watch sglang --metrics http://127.0.0.1:30000/metrics --json "
                                      "--duration 600"))
    _common(s)
    s.add_argument("--tolerance", type=int, default=0, metavar="TOKENS",
                   help="token difference tolerated before a conservation finding (default 0)")
    s.add_argument("--confirm", type=_positive(int), default=2, metavar="N",
                   help="consecutive scrapes an over-count must persist (default 2)")


def _replicas(args: argparse.Namespace) -> list[tuple[str, str | None, str | None]]:
    """``(metrics, events, replay)`` per replica: ``--events`` and ``--replay`` pair with ``--metrics`` by
    position. Raises `UsageError` when the counts do not match."""
    metrics: list[str] = args.metrics
    events: list[str] = getattr(args, "events", None) or []
    replay: list[str] = getattr(args, "replay", None) or []
    if len(metrics) == 1 and len(events) <= 1 and len(replay) <= 1:
        return [(metrics[0], next(iter(events), None), next(iter(replay), None))]
    if len(events) not in (0, len(metrics)):
        raise UsageError(f"{len(metrics)} --metrics but {len(events)} --events; fix: give one --events per "
                         "--metrics, in the same order (or none)")
    if replay and len(replay) != len(events):
        raise UsageError(f"{len(events)} --events but {len(replay)} --replay; fix: give one --replay per --events, "
                         "in the same order")
    return [(m, events[i] if events else None, replay[i] if replay else None) for i, m in enumerate(metrics)]


def _binds(args: argparse.Namespace, events: str | None) -> bool:
    """Whether ``--events-bind`` asks to bind this replica's ``--events`` (bare: every one). Raises `UsageError`
    for an ENDPOINT that is none of the --events."""
    asked: list[str] = getattr(args, "events_bind", None) or []
    for endpoint in asked:
        if endpoint != "*" and endpoint not in (args.events or []):
            raise UsageError(f"--events-bind {endpoint!r} is none of the --events; fix: repeat the --events "
                             "address exactly, or give --events-bind alone to bind every --events")
    return bool(asked) and ("*" in asked or events in asked)


def _make(args: argparse.Namespace, metrics: str, events: str | None, replay: str | None) -> Any:
    from kvguardian.runtime.engines.watch import Watch

    vllm = args.engine == "vllm"
    return Watch(
        args.engine, metrics, interval=args.interval, grace=args.grace, timeout=args.timeout,
        events=events if vllm else None, replay=replay if vllm else None,
        topic=args.topic if vllm else "", num_blocks=args.num_blocks if vllm else None,
        index_limit=args.index_limit if vllm else 1_000_000,
        max_salts_per_prefix=args.max_salts_per_prefix if vllm else 64,
        tolerance=0 if vllm else args.tolerance, confirm=2 if vllm else args.confirm,
        events_bind=_binds(args, events) if vllm else False,
    )


def _watcher(args: argparse.Namespace) -> Watch | Fleet:
    """One `Watch`, or a `Fleet` of them when several --metrics are given."""
    from kvguardian.runtime.engines.fleet import Fleet

    replicas = _replicas(args)
    if len(replicas) == 1:
        return _make(args, *replicas[0])
    watches: list[Any] = []
    try:
        for replica in replicas:
            watches.append(_make(args, *replica))
        return Fleet(watches)
    except BaseException:
        for w in watches:
            w.close()
        raise


def run(args: argparse.Namespace) -> int:
    from kvguardian.core.report import secrets

    for url in (*args.metrics, *(getattr(args, "events", None) or ()), *(getattr(args, "replay", None) or ())):
        secrets.remember_url(url)  # http://user:PASSWORD@…, ?token=…: never in a line, the JSON or the page
    if args.exporter_port is not None and not 0 <= args.exporter_port < 65536:
        raise UsageError(f"--exporter-port {args.exporter_port} is not a TCP port; fix: use 0-65535 (0 picks a "
                         "free one)")
    web = web_config(args)  # a bad --web-config fails before the watch starts
    if args.html:
        check_writable(args.html, "--html")
    watch = _watcher(args)
    out = make_reporter("json" if args.format == "json" else "console", html=args.html)
    with stopping(watch.stop) as ending:  # Ctrl-C, SIGTERM and SIGHUP end the watch; the report is still printed
        report = _watch(args, watch, out, web)
    out.findings(report)
    for line in watch.summary_lines():
        out.text(line)
    out.result(report.to_dict())
    out.close()
    for w in getattr(watch, "watches", [watch]):
        # tried, never reached the server (a scrape in flight when a signal ended the watch was cut off: not
        # counted)
        failed = sum(w.scrape_errors.values()) - (1 if ending.signum is not None else 0)
        if w.scrapes == 0 and failed > 0:
            raise UsageError(
                f"no scrape of {w.metrics_url} succeeded ({w.last_scrape_error}); fix: check that the server "
                "runs and --metrics points at its /metrics", exit_code=EXIT_ENVIRONMENT,
            )
    return report.exit_code(args.fail_on)


def _watch(args: argparse.Namespace, watch: Watch | Fleet, out: Reporter, web: WebConfig) -> Report:
    """Run the watch (with its exporter, if asked for) until the duration or a signal; its report."""
    exporter = None
    try:
        if args.exporter_port is not None:
            exporter = _serve(watch, args.exporter_host, args.exporter_port, web)
        err = ConsoleReporter(stderr=True)
        watch.on_warning = lambda line: err.text(f"kv-guardian watch: warning: {line}", tone="warning")
        if args.format != "json":
            err.text(_banner(args, exporter))

        def show(new: list[Finding]) -> None:
            for f in new:
                out.finding(f)

        watch.run(duration=args.duration, on_new=None if args.format == "json" else show)
        return watch.report()
    finally:
        watch.close()
        if exporter is not None:
            exporter.close()


def _banner(args: argparse.Namespace, exporter: Exporter | None) -> str:
    events = args.events if args.engine == "vllm" and args.events else []
    where = f" and KV events at {', '.join(events)}" if events else ""
    until = f"for {args.duration:g} s" if args.duration else "until Ctrl-C"
    served = f"; metrics on {exporter.url}" if exporter is not None else ""
    return f"watching {args.engine} at {', '.join(args.metrics)}{where} {until}{served}"


def _serve(watch: Watch | Fleet, host: str, port: int, web: WebConfig | None = None) -> Exporter:
    from kvguardian.core.exporters.server import start_exporter
    from kvguardian.runtime.engines.fleet import Fleet
    from kvguardian.runtime.engines.watch_exporter import FleetCollector, WatchCollector

    collector = FleetCollector(watch) if isinstance(watch, Fleet) else WatchCollector(watch)
    return start_exporter(collector=collector, host=host, port=port, check_interval=None, web_config=web)
