"""``kv-guardian run [-o FILE] [--fail-on warning|error] -- python app.py args...``

Audits an unmodified program, like ``memray run``: the program runs as a child with its own stdin, stdout and
stderr; a ``sitecustomize`` first on its PYTHONPATH instruments transformers when the program (or any Python
process it starts) imports it. Each top-level ``generate()`` call and each manually driven cache is a request.
At exit each audited process writes a report; this command merges them into ``-o FILE`` and exits with `EXITS`.
Signals reach the program as without kv-guardian (`kvguardian.runtime.autorun.relay`). Details:
docs/design/autorun.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvguardian.apps.cli.options import add_hidden_alias, add_output
from kvguardian.core.errors import EXIT_ENVIRONMENT, EXIT_INTERNAL, EXIT_OK, UsageError
from kvguardian.core.findings import Finding, Report, Severity
from kvguardian.core.report.console import ConsoleReporter
from kvguardian.core.report.escape import dumps, visible
from kvguardian.core.report.output import add_html_option, check_outputs, write_whole

NAME = "run"
HELP = "audit an unmodified Python program's KV caches (like `memray run`): kv-guardian run -- python app.py"
EXAMPLE = "kv-guardian run -o kv.json --fail-on warning -- python app.py"
EXITS = (
    ("0", "the program exited 0 and no finding reached --fail-on"),
    ("N", "the program's own exit code when not 0 (128+N: killed by signal N)"),
    ("1", "findings reached --fail-on (default: error)"),
    ("2", "a usage error"),
    ("3", "nothing could be audited (transformers unsupported, python -E/-I/-S, or every process with a cache "
          "exited without its exit handlers)"),
    ("126/127", "the program cannot be executed / found"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_output(p, "write the merged JSON report to FILE")
    add_hidden_alias(p, "--report", "output", metavar="FILE")  # its 0.1.0 name, accepted for one release
    p.add_argument("--fail-on", default="error", choices=["info", "warning", "error"],
                   help="exit 1 when a finding reaches this severity (default: %(default)s)")
    p.add_argument("--holder-seconds", type=float, default=120.0, metavar="S",
                   help="wall-clock safety net of the holder-chain search at exit; it is bounded by objects "
                        "visited (default: %(default)s)")
    p.add_argument("--redact", action="store_true", help="hide dictionary keys in holder chains")
    p.add_argument("--decode-stride", type=int, default=8, metavar="N",
                   help="inside a request, observe a cache's decode forwards one in N after its first two (everything "
                        "is observed again at request end); 1 observes every forward (default: %(default)s)")
    add_html_option(p)
    p.add_argument("--memory-snapshot", metavar="OUT.pickle",
                   help="also write the KV history as a PyTorch memory snapshot (python -m "
                        "torch.cuda._memory_viz trace_plot OUT.pickle -o kv.html)")
    p.add_argument("--trace", metavar="OUT.json", help="also write the KV history as a Chrome/Perfetto trace")
    p.add_argument("--quiet", action="store_true", help="no summary on stderr (the report file is still written)")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM [ARGS...]",
                   help="the program to run, after --")


def _say(text: str) -> None:
    try:
        sys.stderr.write(visible(f"kv-guardian run: {text}") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed or full: the line is lost, never the program's exit code
        pass


def _child_env(folder: str, args: argparse.Namespace) -> dict[str, str]:
    from kvguardian.runtime.autorun import BOOT_DIR, ENV_DIR, ENV_OPTIONS

    env = dict(os.environ)
    pkg_parent = str(Path(__file__).resolve().parents[3])  # so a child interpreter can import kvguardian
    parts = [str(BOOT_DIR), pkg_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env[ENV_DIR] = folder
    env[ENV_OPTIONS] = json.dumps({"holder_seconds": args.holder_seconds, "redact": args.redact,
                                   "decode_stride": args.decode_stride})
    env.setdefault("KVG_VLLM_AUDIT", "1")  # a vLLM server audits its own KV cache manager (engines/vllm_plugin)
    return env


_PYTHON = re.compile(r"^(python|pypy)[0-9.]*(\.exe)?$")
_BLIND_FLAGS = {"E": "ignores PYTHONPATH", "I": "runs isolated (ignores PYTHONPATH)",
                "S": "skips the site module (and so sitecustomize)"}
_FLAGS_WITH_VALUE = set("WXQ")


def blind_interpreter(cmd: Sequence[str]) -> str | None:
    """Why kv-guardian's hook cannot load into ``cmd`` (``python -E app.py``: the flag ignores PYTHONPATH),
    or None. Only the interpreter's own options, before the script, ``-c`` or ``-m``, are read."""
    if not cmd or not _PYTHON.match(os.path.basename(cmd[0])):
        return None
    args = iter(cmd[1:])
    for arg in args:
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("--"):
            return None
        for i, flag in enumerate(arg[1:]):
            if flag in _BLIND_FLAGS:
                return f"python -{flag} {_BLIND_FLAGS[flag]}, which kv-guardian's hook needs; fix: drop -{flag}"
            if flag in "cm":
                return None
            if flag in _FLAGS_WITH_VALUE:
                if i == len(arg) - 2:
                    next(args, None)
                break
    return None


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


def _program(args: argparse.Namespace) -> list[str]:
    cmd = list(args.program)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no program to run; fix: kv-guardian run -- python app.py [args...]")
    if not args.holder_seconds > 0 or args.holder_seconds == float("inf"):
        raise UsageError(f"--holder-seconds {args.holder_seconds} must be a number > 0; fix: e.g. 3")
    if args.decode_stride < 1:
        raise UsageError(f"--decode-stride {args.decode_stride} must be an integer >= 1; fix: e.g. 8 (1: every step)")
    outputs = [("--output", args.output), ("--html", args.html), ("--memory-snapshot", args.memory_snapshot),
               ("--trace", args.trace)]
    check_outputs(outputs, [(f"a file the program is given ({a})", a) for a in cmd if os.path.isfile(a)])
    return cmd


def run(args: argparse.Namespace) -> int:
    from kvguardian.runtime.autorun.relay import run_relaying

    cmd = _program(args)
    if shutil.which(cmd[0]) is None and not (os.sep in cmd[0] and os.path.exists(cmd[0])):
        _say(f"program {cmd[0]!r} not found; fix: check the name or PATH")
        return 127
    folder = tempfile.mkdtemp(prefix="kvg-run-")
    t0 = time.monotonic()
    try:
        try:
            outcome = run_relaying(cmd, _child_env(folder, args))
        except PermissionError:
            _say(f"program {cmd[0]!r} is not executable; fix: chmod +x it")
            return 126
        except OSError as exc:
            _say(f"could not start {cmd[0]!r}: {exc.strerror or exc}")
            return 126
        audit = load_audit(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    audit.blind = blind_interpreter(cmd)
    report = merge(cmd, outcome.returncode, audit, seconds=time.monotonic() - t0,
                   signals={"received": _names(outcome.received), "forwarded": _names(outcome.forwarded)})
    written = True
    if args.output:
        try:
            write_whole(args.output, dumps(report.to_dict()) + "\n")
        except OSError as exc:  # checked before the start; gone since (a full disk): say so
            _say(f"error: cannot write --output {args.output}: {exc.strerror or exc}")
            written = False
    written = _write_views(args, report) and written
    if not args.quiet:
        try:
            print_summary(report, audit, ConsoleReporter(stderr=True))
        except (OSError, ValueError):  # as in _say: 2>/dev/full turned the program's code 5 into 1
            pass
    code = exit_code(report, audit, outcome.returncode, Severity.parse(args.fail_on), quiet=args.quiet)
    # a lost output must not read as a clean audit; a program's own failure keeps its code
    return EXIT_ENVIRONMENT if code == EXIT_OK and not written else code


def _write_views(args: argparse.Namespace, report: Report) -> bool:
    """``--html``, ``--memory-snapshot``, ``--trace`` of the merged report; a failure is one line, and False."""
    if not (args.html or args.memory_snapshot or args.trace):
        return True
    from kvguardian.core.report.document import classify
    from kvguardian.core.report.exports import OutputsNotWritten, write_outputs

    source = Path(args.output).name if args.output else "kv-guardian run"
    done: list[str] = []
    ok = True
    try:
        done = write_outputs(classify(report.to_dict(), source=source), html=args.html,
                             memory_snapshot=args.memory_snapshot, trace=args.trace)
    except OutputsNotWritten as exc:
        done, ok = exc.done, False
        _say(f"error: {exc}")
    except UsageError as exc:
        ok = False
        _say(f"error: {exc}")
    for line in [] if args.quiet else done:
        _say(f"wrote {line}")
    return ok


def _names(signals: list[int]) -> list[str]:
    return [_signal_name(s) for s in signals]


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@dataclass
class Audit:
    """What the audited processes left in the run folder."""

    procs: list[dict[str, Any]] = field(default_factory=list)  # report-<pid>.json contents
    markers: dict[int, dict[str, Any]] = field(default_factory=dict)  # pid -> started/forked marker
    with_kv: set[int] = field(default_factory=set)  # pids that used a transformers cache (kv-<pid> markers)
    blind: str | None = None  # why the interpreter could not load the hook

    def had_kv(self, pid: int) -> bool:
        """Whether process ``pid`` had KV: it updated a transformers cache, or was forked from one that had."""
        return pid in self.with_kv or bool(self.markers.get(pid, {}).get("kv"))

    def without_kv(self) -> list[int]:
        """Processes that imported transformers, never used one of its caches and wrote no report (ended
        without exit handlers, as vLLM's model worker does): nothing of theirs is missing from the audit."""
        done = {p.get("pid") for p in self.procs}
        return [pid for pid in sorted(self.markers) if pid not in done and not self.had_kv(pid)]

    def streamed_only(self) -> list[int]:
        """Processes whose report is the last one they streamed while running (a vLLM engine core's audit):
        they ended without writing their final one."""
        return [p["pid"] for p in self.procs if p.get("final") is False]

    def unaudited(self) -> list[dict[str, Any]]:
        """Processes that had KV to audit but wrote no report, each with why (as far as it can be told)."""
        done = {p.get("pid") for p in self.procs}
        out = []
        for pid, m in sorted(self.markers.items()):
            if pid in done or not self.had_kv(pid):
                continue
            if m.get("kind") == "forked":
                why = "a forked child that exited without running exit handlers (os._exit, as multiprocessing " \
                      "'fork' workers do, or a signal)"
            elif m.get("multiprocessing"):
                why = "a multiprocessing worker ended by its pool (terminate) or os._exit"
            else:
                why = "exited without running exit handlers (os._exit or a signal)"
            out.append({"pid": pid, "why": why})
        return out


def load_audit(folder: str) -> Audit:
    audit = Audit()
    for path in sorted(Path(folder).iterdir()):
        kind, _, pid_text = path.name.partition("-")
        if kind == "report" and path.suffix == ".json":
            try:
                audit.procs.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                audit.procs.append({"pid": -1, "status": "error", "message": f"unreadable report {path.name}: {exc}"})
        elif kind == "kv" and pid_text.isdigit():
            audit.with_kv.add(int(pid_text))
        elif kind in ("started", "forked") and pid_text.isdigit():
            try:
                marker = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                marker = {}
            audit.markers[int(pid_text)] = {**(marker if isinstance(marker, dict) else {}), "kind": kind}
    return audit


def merge(cmd: list[str], rc: int, audit: Audit, *, seconds: float, signals: dict[str, list[str]]) -> Report:
    """One report of every audited process; ``summary.complete`` is false when a process was not audited."""
    findings: list[Finding] = []
    for p in audit.procs:
        rep = p.get("report")
        if rep:
            for f in Report.from_dict(rep).findings:
                f.evidence.setdefault("pid", p["pid"])
                findings.append(f)
    unaudited = audit.unaudited()
    reasons = [f"{len(unaudited)} process(es) with KV were not audited"] if unaudited else []
    streamed = audit.streamed_only()
    if streamed:
        reasons.append(f"process(es) {streamed} ended without their final report; the last one they streamed "
                       "(at most a second old) is used")
    if rc < 0:
        reasons.insert(0, f"the program was killed by {_signal_name(-rc)}")
    if audit.blind:
        reasons.append(audit.blind)
    summary: dict[str, Any] = {
        "program": {"argv": shown_argv(cmd), "exit_code": 128 - rc if rc < 0 else rc, "seconds": round(seconds, 3),
                    "killed_by": _signal_name(-rc) if rc < 0 else None, "signals": signals},
        "complete": not reasons,
        "incomplete_reason": "; ".join(reasons) or None,
        "processes": [{k: v for k, v in p.items() if k != "report"}
                      | {"summary": (p.get("report") or {}).get("summary"),
                         "argv": shown_argv(list(p.get("argv") or []))} for p in audit.procs],
        "unaudited": unaudited,
        "unaudited_pids": [u["pid"] for u in unaudited],
        "without_kv_pids": audit.without_kv(),
    }
    return Report(findings=findings, summary=summary)


def print_summary(report: Report, audit: Audit, out: ConsoleReporter) -> None:
    out.heading("kv-guardian run — KV audit of " + " ".join(report.summary["program"]["argv"])[:200])
    for p in audit.procs:
        out.text(_process_line(p))
        skipped = ((p.get("report") or {}).get("summary") or {}).get("hf", {}).get("skipped_layers")
        if skipped:
            out.text(f"    layers without KV (skipped): {skipped}")
    for u in audit.unaudited():
        out.text(f"  pid {u['pid']}: NOT audited: {u['why']}", tone="warning")
    for pid in audit.streamed_only():
        out.text(f"  pid {pid}: ended without its final report; its last streamed one is used", tone="warning")
    for pid in audit.without_kv():
        out.text(f"  pid {pid}: imported transformers but used none of its caches: nothing to audit")
    if audit.procs:
        out.findings(report, per_group=2, more="--report")
    elif audit.markers:
        out.text(f"nothing was audited: {report.summary['incomplete_reason']}", tone="warning")


def _process_line(p: dict[str, Any]) -> str:
    s = (p.get("report") or {}).get("summary") or {}
    if not s:
        return f"  pid {p['pid']}: {p.get('status')} {p.get('message') or ''}"
    ev, kv = s.get("events", {}), s.get("kv", {})
    reuse = (s.get("reuse") or {}).get("by_count") or {}
    return (f"  pid {p['pid']}: {s.get('requests_seen', 0)} request(s), {ev.get('cache_init', 0)} cache init, "
            f"{ev.get('cache_hit', 0)} hit, {ev.get('cache_evict', 0)} evict, {ev.get('cache_release', 0)} "
            f"release; KV alive at exit {kv.get('total_bytes', 0):,} bytes; reuse rate "
            f"{reuse.get('hit_rate')} over {reuse.get('requests', 0)} request(s); audit "
            f"{p.get('audit_seconds', 0)} s")


def exit_code(report: Report, audit: Audit, rc: int, fail_on: Severity, *, quiet: bool = False) -> int:
    """The command's exit code (see the module docstring), after the one line that explains it."""
    if rc < 0:
        _say(f"the program was killed by {_signal_name(-rc)}; exit code {128 - rc}")
        return 128 - rc
    if rc != 0:
        _say(f"the program exited with code {rc}; kv-guardian keeps it")
        return rc
    errors = [p for p in audit.procs if p.get("status") == "error"]
    if errors:
        _say(f"internal error: {errors[0].get('message')} (a bug in kv-guardian)")
        return EXIT_INTERNAL
    unsupported = [p for p in audit.procs if p.get("status") == "unsupported"]
    if unsupported:
        _say(str(unsupported[0].get("message")))
        return EXIT_ENVIRONMENT
    unaudited = audit.unaudited()
    audited = [p for p in audit.procs if p.get("report")]
    if audit.blind and not audited:
        _say(f"nothing was audited: {audit.blind}")
        return EXIT_ENVIRONMENT
    if unaudited:
        pids = [u["pid"] for u in unaudited]
        _say(f"process(es) {pids} used transformers but exited without running exit handlers (os._exit, a "
             "signal, a pool's terminate); their KV was not audited (report: complete false)")
        if not audited:
            return EXIT_ENVIRONMENT
    if not audit.procs and not audit.markers and not quiet:
        _say("the program never imported transformers; nothing to audit")
    code = report.exit_code(fail_on)
    return code if code else EXIT_OK
