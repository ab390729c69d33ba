"""Exports of a report's KV history for tools users already have: a PyTorch memory snapshot
(`kvguardian.report.memory_snapshot`) and a Chrome/Perfetto trace (`kvguardian.report.trace`).

Both need a report with a KV timeline (a Guard report, ``kv-guardian run``, the pytest plugin's lines); every
audit in it that has one is exported (a run's processes, a session's tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvguardian._errors import UsageError
from kvguardian.report.document import Audit, Document
from kvguardian.report.history import History, read_history

__all__ = ["KVAudit", "kv_audits", "write_memory_snapshot_of", "write_outputs", "write_trace_of"]


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
    from kvguardian.report.memory_snapshot import SnapshotAudit, write_memory_snapshot

    return write_memory_snapshot([SnapshotAudit(k.audit.label, k.history, _chains(k.audit)) for k in audits], path)


def write_trace_of(audits: list[KVAudit], path: str | Path) -> int:
    from kvguardian.report.trace import TraceAudit, write_trace

    return write_trace([TraceAudit(k.audit.label, k.history,
                                   [{"id": f.id, "name": f.name, "severity": f.severity, "message": f.message}
                                    for f in k.audit.findings]) for k in audits], path)


def write_outputs(doc: Document, *, html: str | None = None, memory_snapshot: str | None = None,
                  trace: str | None = None) -> list[str]:
    """Write the HTML page, the memory snapshot and the trace of ``doc`` that are asked for; one line per file
    written. Raises `UsageError` before writing anything when an export is asked for and ``doc`` has no KV
    timeline."""
    from kvguardian.report.html import write_html

    audits = kv_audits(doc, "--memory-snapshot/--trace") if (memory_snapshot or trace) else []
    done = []
    if html:
        n = write_html(doc, html)
        done.append(f"{html} ({n:,} bytes, {len(doc.findings)} finding(s))")
    if memory_snapshot:
        n = write_memory_snapshot_of(audits, memory_snapshot)
        done.append(f"{memory_snapshot} ({n:,} bytes; view: python -m torch.cuda._memory_viz trace_plot "
                    f"{memory_snapshot} -o kv.html)")
    if trace:
        n = write_trace_of(audits, trace)
        done.append(f"{trace} ({n:,} bytes; open in Perfetto or chrome://tracing)")
    return done
