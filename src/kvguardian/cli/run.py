"""``kv-guardian run [--report FILE] [--fail-on warning|error] -- python app.py args...``

Audits an unmodified program, like ``memray run``: the program runs as a child process with its own stdin,
stdout and stderr; a ``sitecustomize`` put first on its PYTHONPATH instruments transformers when the program
imports it (every Python process it starts, too). Each top-level ``generate()`` call and each manually driven
cache is a request. At exit each audited process writes a report; this command merges them, writes
``--report FILE`` (JSON), prints a summary on stderr, and exits with:

* the program's own exit code when it is not 0 (128+N when killed by signal N), after one line saying so;
* 1 when findings reach ``--fail-on`` (default ``error``);
* 3 when the program's transformers is unsupported, or it imported transformers but exited without running
  its exit handlers (``os._exit``, a signal), so nothing could be audited;
* 127/126 when the program cannot be found/executed, 2 for a usage error; 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvguardian._errors import EXIT_ENVIRONMENT, EXIT_INTERNAL, EXIT_OK, UsageError

NAME = "run"
HELP = "audit an unmodified Python program's KV caches (like `memray run`): kv-guardian run -- python app.py"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", metavar="FILE", help="write the merged JSON report here")
    p.add_argument("--fail-on", default="error", choices=["info", "warning", "error"],
                   help="exit 1 when a finding reaches this severity (default: %(default)s)")
    p.add_argument("--holder-seconds", type=float, default=120.0, metavar="S",
                   help="wall-clock safety net of the holder-chain search at exit; it is bounded by objects "
                        "visited (default: %(default)s)")
    p.add_argument("--redact", action="store_true", help="hide dictionary keys in holder chains")
    p.add_argument("--quiet", action="store_true", help="no summary on stderr (the report file is still written)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PROGRAM [ARGS...]",
                   help="the program to run, after --")


def _child_env(folder: str, args: argparse.Namespace) -> dict[str, str]:
    from kvguardian.autorun import BOOT_DIR, ENV_DIR, ENV_OPTIONS

    env = dict(os.environ)
    pkg_parent = str(Path(__file__).resolve().parents[2])  # so a child interpreter can import kvguardian
    parts = [str(BOOT_DIR), pkg_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env[ENV_DIR] = folder
    env[ENV_OPTIONS] = json.dumps({"holder_seconds": args.holder_seconds, "redact": args.redact})
    env.setdefault("KVG_VLLM_AUDIT", "1")  # a vLLM server audits its own KV cache manager (engines/vllm_plugin)
    return env


def shown_argv(argv: list[str]) -> list[str]:
    """A command line without its arguments, which may carry user data (prompts, keys): the program, and for
    Python the script or ``-m`` module; the rest is counted."""
    keep = 1
    if argv and Path(argv[0]).name.startswith("python"):
        i = 1
        while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c"):
            i += 1
        keep = min(len(argv), i + (2 if i < len(argv) and argv[i] == "-m" else 1))
        if keep <= len(argv) and argv[keep - 1:keep] == ["-c"]:
            return [*argv[:keep], "<code>"] + ([f"(+{len(argv) - keep - 1} arguments)"] if len(argv) > keep + 1
                                               else [])
    shown = argv[:keep]
    return shown + ([f"(+{len(argv) - keep} arguments)"] if len(argv) > keep else [])


def run(args: argparse.Namespace) -> int:
    from kvguardian.findings import Finding, Report, Severity

    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no program to run; fix: kv-guardian run -- python app.py [args...]")
    if args.holder_seconds <= 0:
        raise UsageError(f"--holder-seconds {args.holder_seconds} must be > 0")
    if shutil.which(cmd[0]) is None and not (os.sep in cmd[0] and os.path.exists(cmd[0])):
        sys.stderr.write(f"kv-guardian run: program {cmd[0]!r} not found; fix: check the name or PATH\n")
        return 127
    folder = tempfile.mkdtemp(prefix="kvg-run-")
    t0 = time.monotonic()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the child; we wait for its report
    try:
        try:
            proc = subprocess.Popen(cmd, env=_child_env(folder, args))
        except PermissionError:
            sys.stderr.write(f"kv-guardian run: program {cmd[0]!r} is not executable; fix: chmod +x it\n")
            return 126
        except OSError as exc:
            sys.stderr.write(f"kv-guardian run: could not start {cmd[0]!r}: {exc.strerror or exc}\n")
            return 126
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    seconds = time.monotonic() - t0
    try:
        procs, started = _load(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    findings: list[Finding] = []
    for p in procs:
        rep = p.get("report")
        if rep:
            for f in Report.from_dict(rep).findings:
                f.evidence.setdefault("pid", p["pid"])
                findings.append(f)
    missing = sorted(set(started) - {p["pid"] for p in procs})
    summary: dict[str, Any] = {
        "program": {"argv": shown_argv(cmd), "exit_code": rc, "seconds": round(seconds, 3)},
        "processes": [{k: v for k, v in p.items() if k != "report"} | {"summary": (p.get("report") or {})
                                                                         .get("summary")}
                      | {"argv": shown_argv(list(p.get("argv") or []))} for p in procs],
        "unaudited_pids": missing,
    }
    report = Report(findings=findings, summary=summary)
    if args.report:
        try:
            Path(args.report).write_text(report.to_json())
        except OSError as exc:
            raise UsageError(f"cannot write --report {args.report}: {exc.strerror or exc}") from None
    if not args.quiet:
        _print_summary(report, procs)

    if rc < 0:
        sig = -rc
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        sys.stderr.write(f"kv-guardian run: the program was killed by {name}; exit code {128 + sig}\n")
        return 128 + sig
    if rc != 0:
        sys.stderr.write(f"kv-guardian run: the program exited with code {rc}; kv-guardian keeps it\n")
        return rc
    if any(p.get("status") == "error" for p in procs):
        msg = next(p.get("message") for p in procs if p.get("status") == "error")
        sys.stderr.write(f"kv-guardian run: internal error: {msg} (a bug in kv-guardian)\n")
        return EXIT_INTERNAL
    unsupported = [p for p in procs if p.get("status") == "unsupported"]
    if unsupported:
        sys.stderr.write(f"kv-guardian run: {unsupported[0].get('message')}\n")
        return EXIT_ENVIRONMENT
    if missing:
        sys.stderr.write(
            f"kv-guardian run: process(es) {missing} imported transformers but exited without running exit "
            "handlers (os._exit or a signal); their KV was not audited\n"
        )
        return EXIT_ENVIRONMENT
    if not procs and not args.quiet:
        sys.stderr.write("kv-guardian run: the program never imported transformers; nothing to audit\n")
    code = report.exit_code(Severity.parse(args.fail_on))
    return code if code else EXIT_OK


def _load(folder: str) -> tuple[list[dict[str, Any]], list[int]]:
    procs, started = [], []
    for path in sorted(Path(folder).iterdir()):
        if path.name.startswith("report-") and path.suffix == ".json":
            try:
                procs.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                procs.append({"pid": -1, "status": "error", "message": f"unreadable report {path.name}: {exc}"})
        elif path.name.startswith("started-"):
            try:
                started.append(int(path.name.split("-", 1)[1]))
            except ValueError:
                pass
    return procs, started


def _print_summary(report: Any, procs: list[dict[str, Any]]) -> None:
    from rich.console import Console

    con = Console(file=sys.stderr, soft_wrap=True, highlight=False)
    con.print("[bold]kv-guardian run[/] — KV audit of " + " ".join(report.summary["program"]["argv"])[:200],
              markup=True, highlight=False)
    for p in procs:
        s = (p.get("report") or {}).get("summary") or {}
        if not s:
            con.print(f"  pid {p['pid']}: {p.get('status')} {p.get('message') or ''}", markup=False)
            continue
        ev = s.get("events", {})
        kv = s.get("kv", {})
        reuse = (s.get("reuse") or {}).get("by_count") or {}
        hf = s.get("hf") or {}
        con.print(
            f"  pid {p['pid']}: {s.get('requests_seen', 0)} request(s), {ev.get('cache_init', 0)} cache init, "
            f"{ev.get('cache_hit', 0)} hit, {ev.get('cache_evict', 0)} evict, {ev.get('cache_release', 0)} "
            f"release; KV alive at exit {kv.get('total_bytes', 0):,} bytes; reuse rate "
            f"{reuse.get('hit_rate')} over {reuse.get('requests', 0)} request(s); audit "
            f"{p.get('audit_seconds', 0)} s",
            markup=False,
        )
        if hf.get("skipped_layers"):
            con.print(f"    layers without KV (skipped): {hf['skipped_layers']}", markup=False)
    _print_findings(report, con)


def _print_findings(report: Any, con: Any, per_group: int = 2) -> None:
    """Findings worst first; of several findings with the same id, severity and holder root, the first
    ``per_group`` in full and a count of the rest (the JSON report has them all)."""
    from kvguardian.report.console import _STYLE

    groups: dict[tuple[str, str, str], list[Any]] = {}
    for f in sorted(report.findings, key=lambda f: -f.severity.rank):
        root = f.holder_chain[0] if f.holder_chain else ""
        groups.setdefault((f.id, f.severity.value, root), []).append(f)
    for items in groups.values():
        for f in items[:per_group]:
            con.print(f"[{_STYLE[f.severity]}]{f.id} {f.name} ({f.severity.value})[/] {f.message}", markup=True)
            if f.holder_chain:
                con.print("  held by: " + f.render_chain(), markup=False)
        if len(items) > per_group:
            con.print(f"  … and {len(items) - per_group} more like this (see --report)", markup=False)
        con.print(f"  fix: {items[0].fix}", markup=False)
    counts = report.counts()
    con.print(f"{len(report.findings)} finding(s): {counts['error']} error, {counts['warning']} warning, "
              f"{counts['info']} info", markup=False)
