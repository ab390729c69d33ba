"""Exports of a report's KV history for tools users already have: a PyTorch memory snapshot
(`kvguardian.core.report.memory_snapshot`) and a Chrome/Perfetto trace (`kvguardian.core.report.trace`).

Both need a report with a KV timeline (a Guard report, ``kv-guardian run``, the pytest plugin's lines); every
audit in it that has one is exported (a run's processes, a session's tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError
from kvguardian.core.report.document import Audit, Document
from kvguardian.core.report.history import History, read_history

__all__ = ["KVAudit", "OutputsNotWritten", "kv_audits", "write_memory_snapshot_of", "write_outputs", "write_trace_of"]


@dataclass(frozen=True)
class KVAudit:
    audit: Audit
    history: History


def kv_audits(doc: Document, what: str) -> list[KVAudit]:
    """The audits of ``doc`` with a readable timeline. Raises `UsageError` (saying ``what`` needs one) when none
    has one."""
    out = []
    problems = []
    for a in doc.audits:
        tl = a.timeline
        if tl is None:
            continue
        try:
            out.append(KVAudit(a, read_history(tl)))
        except UsageError as exc:
            problems.append(f"{a.label}: {exc}")
    if not out:
        why = f" (damaged: {problems[0]})" if problems else ""
        raise UsageError(f"{doc.source} ({doc.kind} report) has no KV timeline{why}; {what} needs one: a report "
                         "of kv-guardian run --report, Guard.check().to_json() or pytest --kv-report")
    return out


def _chains(a: Audit) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for f in a.findings:
        rid = f.evidence.get("request_id")
        if f.holder_chain and rid is not None:
            out.setdefault(str(rid), f.holder_chain)
    return out


def write_memory_snapshot_of(audits: list[KVAudit], path: str | Path) -> int:
    from kvguardian.core.report.memory_snapshot import SnapshotAudit, write_memory_snapshot

    return write_memory_snapshot([SnapshotAudit(k.audit.label, k.history, _chains(k.audit)) for k in audits], path)


def write_trace_of(audits: list[KVAudit], path: str | Path) -> int:
    from kvguardian.core.report.trace import TraceAudit, write_trace

    return write_trace([TraceAudit(k.audit.label, k.history,
                                   [{"id": f.id, "name": f.name, "severity": f.severity, "message": f.message}
                                    for f in k.audit.findings]) for k in audits], path)


class OutputsNotWritten(UsageError):
    """Some asked-for outputs could not be written (the others were): ``done`` says what was."""

    def __init__(self, message: str, done: list[str]) -> None:
        super().__init__(message, exit_code=EXIT_ENVIRONMENT)
        self.done = done


def write_outputs(doc: Document, *, html: str | None = None, memory_snapshot: str | None = None,
                  trace: str | None = None, flags: tuple[str, str, str] = ("--html", "--memory-snapshot",
                                                                         "--trace")) -> list[str]:
    """Write the HTML page, the memory snapshot and the trace of ``doc`` that are asked for; one line per file
    written. Raises `UsageError` before writing anything when an export is asked for and ``doc`` has no KV
    timeline, and `OutputsNotWritten` (naming each failed one by its flag in ``flags``) after trying all of
    them when some could not be written: a full disk for one loses none of the others."""
    from kvguardian.core.report.html import write_html

    audits = kv_audits(doc, "--memory-snapshot/--trace") if (memory_snapshot or trace) else []
    jobs = [
        (flags[0], html, lambda path: f"{path} ({write_html(doc, path):,} bytes, {len(doc.findings)} finding(s))"),
        (flags[1], memory_snapshot, lambda path: f"{path} ({write_memory_snapshot_of(audits, path):,} bytes; "
                                                 f"view: python -m torch.cuda._memory_viz trace_plot {path} -o "
                                                 "kv.html)"),
        (flags[2], trace, lambda path: f"{path} ({write_trace_of(audits, path):,} bytes; open in Perfetto or "
                                       "chrome://tracing)"),
    ]
    done, failed = [], []
    for flag, path, write in jobs:
        if not path:
            continue
        try:
            done.append(write(path))
        except OSError as exc:
            failed.append(f"cannot write {flag} {path}: {exc.strerror or exc}")
    if failed:
        raise OutputsNotWritten("; ".join(failed) + "; fix: free space or write elsewhere", done)
    return done
