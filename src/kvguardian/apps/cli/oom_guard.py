"""``kv-guardian oom-guard``: a sidecar that drains a server before the kernel's OOM killer reaches it.

    kv-guardian oom-guard --pid 1234 --metrics http://127.0.0.1:8000/metrics --port 8081
    kv-guardian oom-guard --cgroup /sys/fs/cgroup/memory/mygroup
    kv-guardian oom-guard --pod-uid $POD_UID --cgroup-root /host/cgroup --host 0.0.0.0   # in Kubernetes

Serves /ready (the readiness probe), /drain (preStop), /metrics and /status on kv-guardian's bounded HTTP
server, with TLS and basic auth from --web-config (`kvguardian.ops.oom.sidecar`). It cannot evict inside vLLM
or SGLang: it turns readiness false and drains. Exit codes: `EXITS`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvguardian.apps.cli.options import add_duration_option
from kvguardian.apps.cli.signals import stopping
from kvguardian.apps.cli.web_options import add_web_config, web_config
from kvguardian.core.errors import EXIT_ENVIRONMENT, EXIT_OK, UsageError
from kvguardian.ops.oom.policy import Watermarks

if TYPE_CHECKING:
    from kvguardian.ops.oom.sidecar import Sidecar
    from kvguardian.ops.oom.signals.base import Signal

NAME = "oom-guard"
HELP = "sidecar pre-OOM guard for a server we cannot hook: /ready turns false and /drain waits before an OOM kill"
EXAMPLE = "kv-guardian oom-guard --pid 4242 --metrics http://127.0.0.1:8000/metrics --port 8081"
EXITS = (
    ("0", "SIGTERM, or --duration passed"),
    ("2", "bad input: no such PID or cgroup, no memory limit, watermarks out of order"),
    ("3", "something it needs is missing (NVML), or the target went away while watched"),
)


#: The policy's watermarks: each a `Watermarks` field of the same name -> its help.
_WATERMARKS = {
    "evict": "evict watermark (default 0.92: logged and exported; the sidecar cannot evict inside the server)",
    "drain": "drain watermark: readiness false (default 0.97)",
    "shed": "shed watermark (default 0.99)",
    "hysteresis": "release below watermark - this (default 0.03)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int, help="watch the memory cgroup of this process (found via /proc/PID/cgroup)")
    target.add_argument("--cgroup", metavar="PATH", help="watch this cgroup directory (v1 or v2)")
    target.add_argument("--pod-uid", metavar="UID", help="watch this Kubernetes pod's cgroup (with --cgroup-root)")
    p.add_argument("--cgroup-root", default="/sys/fs/cgroup", metavar="DIR",
                   help="where the node's cgroupfs is mounted, for --pod-uid (default /sys/fs/cgroup)")
    p.add_argument("--metrics", metavar="URL", help="the server's Prometheus page; /drain waits for 0 running requests")
    p.add_argument("--nvml-index", type=int, action="append", default=[], metavar="N",
                   help="also watch GPU N through NVML (repeatable)")
    p.add_argument("--memory-limit-mb", type=int, metavar="MB",
                   help="the limit to judge against when the cgroup has none")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 in a pod, so the "
                                                         "kubelet's probes reach it)")
    p.add_argument("--port", type=int, default=8081, help="TCP port (default 8081; 0 picks one)")
    defaults = {f.name: f.default for f in dataclasses.fields(Watermarks)}
    for name, text in _WATERMARKS.items():  # the type and default are Watermarks'
        p.add_argument(f"--{name}", type=type(defaults[name]), default=defaults[name], help=text)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    p.add_argument("--drain-deadline", type=float, default=60.0,
                   help="longest /drain waits, seconds (default 60; keep terminationGracePeriodSeconds longer)")
    p.add_argument("--settle", type=float, default=5.0, help="without --metrics, how long /drain waits (default 5)")
    p.add_argument("--once", action="store_true", help="sample once, print the status as JSON and exit")
    add_duration_option(p)
    add_web_config(p)


class _FixedLimit:
    """A signal whose limit is given (the cgroup has none)."""

    fast = False

    def __init__(self, inner: Signal, limit: int) -> None:
        self.inner, self.limit, self.name = inner, limit, inner.name

    def read(self) -> Any:
        import dataclasses

        r = self.inner.read()
        return r if r.error is not None else dataclasses.replace(r, limit=self.limit,
                                                                 source=f"{r.source}, limit from --memory-limit-mb")


def _cgroup(args: argparse.Namespace) -> tuple[Any, Path | None]:
    from kvguardian.ops.oom.signals.cgroup import cgroup_signal, cgroup_signal_for_pid, cgroup_signal_for_pod

    if args.pid is not None:
        if args.pid <= 0:
            raise UsageError(f"--pid {args.pid} is not a process id; fix: the PID of the server")
        sig = cgroup_signal_for_pid(args.pid)
        return sig, None
    if args.cgroup is not None:
        sig = cgroup_signal(args.cgroup)
        return sig, Path(args.cgroup)
    sig = cgroup_signal_for_pod(args.pod_uid, args.cgroup_root)
    return sig, sig.path


def _check_numbers(args: argparse.Namespace) -> None:
    """--memory-limit-mb, --drain-deadline and --settle: a negative limit made every reading nonsense, and a
    nan deadline made /drain wait for ever (nan <= 0 is never true)."""
    if args.memory_limit_mb is not None and args.memory_limit_mb <= 0:
        raise UsageError(f"--memory-limit-mb {args.memory_limit_mb} must be > 0; fix: the container's limit in MB, "
                         "e.g. --memory-limit-mb 16384")
    for flag, value in (("--drain-deadline", args.drain_deadline), ("--settle", args.settle)):
        if not 0 <= value <= 86400:  # nan fails too
            raise UsageError(f"{flag} {value:g} must be a number of seconds in 0..86400; fix: e.g. {flag} 30")


def build(args: argparse.Namespace) -> Sidecar:
    """The `Sidecar` the arguments describe (bad input raises `UsageError` with the fix)."""
    from kvguardian.ops.oom.guard import OOMGuard
    from kvguardian.ops.oom.sidecar import Sidecar, Target
    from kvguardian.ops.oom.signals.nvml import NvmlSignal

    wm = Watermarks(**{name: getattr(args, name) for name in _WATERMARKS})
    _check_numbers(args)
    if args.metrics is not None:
        from kvguardian.runtime.engines.promtext import check_url

        check_url(args.metrics)
    cg, cg_dir = _cgroup(args)
    first = cg.read()
    if first.error is not None:
        raise UsageError(f"cannot read {first.source}: {first.error}; fix: check the path and permissions")
    if first.limit is None:
        if args.memory_limit_mb is None:
            raise UsageError(f"{first.source} has no memory limit set, so there is nothing to guard against; fix: "
                             "set resources.limits.memory on the container, or pass --memory-limit-mb")
        cg = _FixedLimit(cg, args.memory_limit_mb << 20)
    elif args.memory_limit_mb is not None:
        cg = _FixedLimit(cg, min(first.limit, args.memory_limit_mb << 20))
    signals = [cg, *(NvmlSignal(i) for i in args.nvml_index)]
    oom = OOMGuard(signals, watermarks=wm, interval=args.interval)
    return Sidecar(oom, Target(pid=args.pid, cgroup=cg_dir, metrics_url=args.metrics),
                   drain_deadline=args.drain_deadline, settle=args.settle)


def _serve(sidecar: Sidecar, args: argparse.Namespace) -> str:
    """Start the sidecar's HTTP server; its base URL. Bad addresses and certificates are one line."""
    from kvguardian.core.exporters.http import bind_fix

    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port; fix: use 0-65535 (0 picks a free one)")
    web = web_config(args)
    try:
        host, port = sidecar.serve(args.host, args.port, web=web)
    except OSError as exc:
        fix = bind_fix(exc, port_flag="--port", host_flag="--host")
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}; fix: {fix}",
                         exit_code=EXIT_ENVIRONMENT) from None
    return f"{sidecar.scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def run(args: argparse.Namespace) -> int:
    sidecar = build(args)
    oom = sidecar.oom
    if args.once:
        oom.sample()
        print(json.dumps(oom.status(), indent=2))
        return EXIT_OK
    url = _serve(sidecar, args)
    stop = threading.Event()
    oom.start()
    t0 = time.monotonic()
    try:
        with stopping(stop.set):  # SIGINT, SIGTERM and SIGHUP stop it (exit 0)
            sys.stderr.write(f"kv-guardian oom-guard: watching {oom.signals[0].read().source}; /ready /drain /metrics "
                             f"on {url} (it cannot evict inside the server: it drains)\n")
            sys.stderr.flush()
            while not stop.wait(min(args.interval, 0.5)):
                gone = sidecar.target.gone()
                if gone is not None:
                    oom.sample("manual", wait=True)  # the kernel's count after the exit (the cgroup may outlive it)
                    kills = sidecar.oom_kills()
                    sys.stderr.write(f"kv-guardian oom-guard: {gone} (the kernel counted {kills} OOM kill(s) in its "
                                     "cgroup); stopping\n")
                    return EXIT_ENVIRONMENT
                if args.duration is not None and time.monotonic() - t0 >= args.duration:
                    break
    finally:
        oom.stop()
        sidecar.close()
    return EXIT_OK
