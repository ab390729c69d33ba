"""Reading a report file: which kind it is, whether this kv-guardian can read it, and what the page shows.

Every report kv-guardian writes is accepted: guard, run, pytest (JSON lines), watch, repro, redis-scan,
redis-diff and any other schema-1 Report. Another schema or version, a damaged file or a foreign one is refused
with one `UsageError` line; a JSON-lines file with a cut last line keeps its complete lines. Which command
writes each kind: docs/design/report.md.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvguardian.core.errors import UsageError
from kvguardian.core.input_file import MAX_DOCUMENT_BYTES, read_input
from kvguardian.core.report import secrets

__all__ = ["REPORT_SCHEMA", "SCAN_SCHEMA", "Audit", "Document", "FindingView", "classify", "load_document",
           "parse_document", "tool_version"]

Redact = Callable[[Any], Any]  # report JSON -> the same JSON with names hidden


def tool_version() -> str:
    """This kv-guardian's version, for what a renderer writes. Read from the package, which Python imports before
    any of its modules (``from kvguardian import __version__`` here would point an import up the layers)."""
    return str(getattr(sys.modules.get("kvguardian"), "__version__", "unknown"))

REPORT_SCHEMA = 1  # kvguardian.core.findings.SCHEMA_VERSION: the versions this renderer reads
SCAN_SCHEMA = ("kv-guardian/redis-scan", 1)
_SEVERITIES = ("error", "warning", "info")
_WRITE_AGAIN = ("write one with kv-guardian run --report FILE, redis scan --json, redis diff --json, watch --json, "
                "repro NAME --json, pytest --kv-report FILE, or Guard.check().to_json()")


@dataclass(frozen=True)
class FindingView:
    """A finding as the page shows it (findings of newer kv-guardians, with ids this one does not know, too)."""

    id: str
    name: str
    severity: str  # error | warning | info
    message: str
    evidence: Mapping[str, Any]
    holder_chain: tuple[str, ...]
    fix: str
    origin: str = ""  # where it was found, when a report merges several audits ("pid 412", a test id)


@dataclass(frozen=True)
class Audit:
    """One KV audit (a process, a test, a Guard): its ledger summary, and the timeline in it when present."""

    label: str
    summary: Mapping[str, Any]
    findings: tuple[FindingView, ...]

    @property
    def timeline(self) -> Mapping[str, Any] | None:
        t = self.summary.get("timeline")
        return t if isinstance(t, Mapping) else None


@dataclass
class Document:
    """A parsed report: its kind, the findings and audits the page shows, and the original data."""

    kind: str
    title: str
    source: str
    data: Mapping[str, Any]
    findings: list[FindingView] = field(default_factory=list)
    audits: list[Audit] = field(default_factory=list)
    created: float | None = None
    facts: list[tuple[str, str]] = field(default_factory=list)  # what was audited, when, which versions
    notes: list[str] = field(default_factory=list)  # problems met while reading (a skipped damaged line)


# ---------------------------------------------------------------------------------------------- reading
def load_document(path: str | Path, *, redact: Redact | None = None) -> Document:
    """Read and classify a report file; with ``redact`` (a function from report JSON to report JSON: the
    command's ``--redact``, `kvguardian.apps.cli.report.redact_report`), each document passed through it first.
    Raises `UsageError` (one line: the file, the problem, the fix)."""
    p = Path(path)
    where = f"report file {str(p)!r}"
    raw = read_input(p, where, max_bytes=MAX_DOCUMENT_BYTES)
    try:
        body = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where} is not UTF-8 text (byte {exc.start}); {_WRITE_AGAIN}") from None
    return parse_document(body, source=p.name, where=where, redact=redact)


def parse_document(body: str, *, source: str = "report", where: str = "the report",
                   redact: Redact | None = None) -> Document:
    """Classify JSON text (one document, or JSON lines of the pytest plugin)."""
    if not body.strip():
        raise UsageError(f"{where} is empty; {_WRITE_AGAIN}")
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        lines = _json_lines(body)
        if lines is None:
            raise UsageError(f"{where} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); it may "
                             f"be truncated or damaged: write it again ({_WRITE_AGAIN})") from None
        if redact is not None:
            lines = ([redact(d) for d in lines[0]], lines[1])
        return _pytest_document(lines, source, where)
    except RecursionError:
        raise UsageError(f"{where} nests JSON too deeply to be a kv-guardian report; {_WRITE_AGAIN}") from None
    secrets.remember_urls_in(data)  # a credential an older writer left in a URL is shown as ***
    return classify(redact(data) if redact is not None else data, source=source, where=where)


def _json_lines(body: str) -> tuple[list[Any], list[int]] | None:
    """The documents of a JSON-lines file and the numbers of damaged lines, or None when it is not one."""
    docs: list[Any] = []
    bad: list[int] = []
    rows = body.splitlines()
    for no, line in enumerate(rows, 1):
        if not line.strip():
            continue
        try:
            docs.append(json.loads(line))
        except json.JSONDecodeError:
            bad.append(no)
    if not docs or not all(isinstance(d, dict) and "test" in d for d in docs):
        return None
    # only a cut last line is tolerated (a session stopped while writing); damage inside is refused
    last = max((no for no, line in enumerate(rows, 1) if line.strip()), default=0)
    if any(no != last for no in bad):
        return None
    return docs, bad


def classify(data: object, *, source: str = "report", where: str = "the report") -> Document:
    """A `Document` of parsed JSON ``data``. Raises `UsageError` for another schema or version, or data that is
    not a kv-guardian report."""
    if not isinstance(data, dict):
        raise UsageError(f"{where} holds a JSON {type(data).__name__}, not a kv-guardian report; {_WRITE_AGAIN}")
    schema = data.get("schema")
    if isinstance(schema, str):
        return _scan_document(data, source, where)
    if schema is None:
        return _repro_document(data, source, where)
    if isinstance(schema, bool) or not isinstance(schema, int) or data.get("tool") != "kv-guardian":
        raise UsageError(f"{where} has \"schema\": {json.dumps(schema)[:40]} and \"tool\": "
                         f"{json.dumps(data.get('tool'))[:40]}, not a kv-guardian report; {_WRITE_AGAIN}")
    if schema != REPORT_SCHEMA:
        raise UsageError(f"{where} is a kv-guardian report of schema version {schema}; this kv-guardian reads "
                         f"version {REPORT_SCHEMA}; fix: render it with the kv-guardian that wrote it, or upgrade")
    if "rows" in data:
        return _diff_document(data, source, where)
    if "test" in data:
        return _pytest_document(([data], []), source, where)
    summary = _mapping(data.get("summary"), f"{where}: \"summary\"")
    if isinstance(summary.get("program"), Mapping):
        return _run_document(data, summary, source, where)
    if "engine" in summary and "metrics_url" in summary:
        return _report_document(data, summary, "watch", source, where)
    kind = "guard" if "requests_seen" in summary else "report"
    return _report_document(data, summary, kind, source, where)


# ---------------------------------------------------------------------------------------------- helpers
def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError(f"{what} is a JSON {type(value).__name__}, not an object; the file is damaged: write it "
                         "again")
    return value


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def finding_views(items: object, where: str, origin: str = "") -> list[FindingView]:
    """Validate a JSON list of findings (`Finding.to_dict` form)."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise UsageError(f"{where}: \"findings\" is a JSON {type(items).__name__}, not a list; the file is damaged")
    out = []
    for i, f in enumerate(items):
        if not isinstance(f, Mapping) or not isinstance(f.get("id"), str) or not isinstance(f.get("message"), str):
            raise UsageError(f"{where}: finding {i} has no \"id\" and \"message\" strings; the file is damaged: write "
                             "it again")
        sev = str(f.get("severity", "")).lower()
        if sev not in _SEVERITIES:
            got = str(f.get("severity"))[:40]
            raise UsageError(f"{where}: finding {i} ({f['id'][:80]}) has severity {got!r}; expected one of "
                             f"{', '.join(_SEVERITIES)}")
        chain = f.get("holder_chain") or []
        if not isinstance(chain, list) or not all(isinstance(s, str) for s in chain):
            raise UsageError(f"{where}: finding {i} ({f['id']}) has a holder_chain that is not a list of strings")
        evidence = f.get("evidence") or {}
        out.append(FindingView(
            id=f["id"], name=str(f.get("name") or ""), severity=sev, message=f["message"],
            evidence=evidence if isinstance(evidence, Mapping) else {"value": evidence},
            holder_chain=tuple(chain), fix=str(f.get("fix") or ""), origin=origin,
        ))
    return out


def _when(data: Mapping[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = _number(data.get(k))
        if v is not None:
            return v
    return None


def _versions(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    v = summary.get("versions")
    if not isinstance(v, Mapping):
        return []
    return [("versions", ", ".join(f"{k} {val}" for k, val in v.items() if val is not None))]


# ---------------------------------------------------------------------------------------------- kinds
def _report_document(data: Mapping[str, Any], summary: Mapping[str, Any], kind: str, source: str,
                     where: str) -> Document:
    findings = finding_views(data.get("findings"), where)
    title = f"kv-guardian watch {summary.get('engine')}" if kind == "watch" else "kv-guardian KV audit"
    doc = Document(kind=kind, title=title, source=source, data=data, findings=findings,
                   created=_when(data, "created"))
    if kind in ("guard", "report"):
        doc.audits.append(Audit("this process", summary, tuple(findings)))
        doc.facts.append(("audited", f"{summary.get('requests_seen', 0)} request(s), "
                                     f"{summary.get('entries', 0)} KV entries alive at the check"))
    else:
        doc.facts.append(("watched", f"{summary.get('metrics_url')} for {summary.get('seconds_watched')} s, "
                                     f"{summary.get('scrapes')} scrape(s)"))
    doc.facts.extend(_versions(summary))
    return doc


def _run_document(data: Mapping[str, Any], summary: Mapping[str, Any], source: str, where: str) -> Document:
    program = summary["program"]
    argv = program.get("argv") if isinstance(program.get("argv"), list) else []
    findings = finding_views(data.get("findings"), where)
    doc = Document(kind="run", title="kv-guardian run — " + " ".join(str(a) for a in argv)[:200], source=source,
                   data=data, created=_when(data, "created"))
    listed = summary.get("processes")
    procs: list[Any] = listed if isinstance(listed, list) else []
    by_pid: dict[str, list[FindingView]] = {}
    for f in findings:
        pid = f.evidence.get("pid")
        by_pid.setdefault(str(pid), []).append(f)
    for p in procs:
        if not isinstance(p, Mapping):
            continue
        label = f"pid {p.get('pid')}"
        own = by_pid.get(str(p.get("pid")), [])
        doc.audits.append(Audit(label, _mapping(p.get("summary"), f"{where}: {label} summary"),
                                tuple(FindingView(**{**f.__dict__, "origin": label}) for f in own)))
        doc.facts.append((label, f"{p.get('status')}" + (f": {p.get('message')}" if p.get("message") else "")))
    doc.findings = [FindingView(**{**f.__dict__, "origin": f"pid {f.evidence.get('pid')}"})
                    if "pid" in f.evidence else f for f in findings]
    doc.facts.insert(0, ("program", f"{' '.join(str(a) for a in argv)[:300]} — exit code {program.get('exit_code')}, "
                                    f"{program.get('seconds')} s"))
    if summary.get("unaudited_pids"):
        doc.facts.append(("not audited", ", ".join(str(x) for x in summary["unaudited_pids"])))
    first = next((a.summary for a in doc.audits if a.summary), {})
    doc.facts.extend(_versions(first))
    return doc


def _pytest_document(lines: tuple[list[Any], list[int]], source: str, where: str) -> Document:
    docs, bad = lines
    doc = Document(kind="pytest", title="kv-guardian pytest session", source=source, data={"tests": docs})
    for i, d in enumerate(docs):
        test = str(d.get("test"))
        if d.get("schema") != REPORT_SCHEMA:
            raise UsageError(f"{where}: test {test!r} has report schema {d.get('schema')!r}; this kv-guardian reads "
                             f"version {REPORT_SCHEMA}")
        own = finding_views(d.get("findings"), f"{where}: line {i + 1}", origin=test)
        doc.findings.extend(own)
        doc.audits.append(Audit(test, _mapping(d.get("summary"), f"{where}: test {test!r} summary"), tuple(own)))
        created = _number(d.get("created"))
        if created is not None:
            doc.created = created if doc.created is None else max(doc.created, created)
    doc.facts.append(("tests checked", f"{len(docs)}"))
    for no in bad:
        doc.notes.append(f"line {no} of {source} is cut short (the session stopped while writing it) and was "
                         "skipped; every complete line is shown")
    return doc


def _diff_document(data: Mapping[str, Any], source: str, where: str) -> Document:
    rows = data.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) and isinstance(r.get("pattern"), str)
                                             for r in rows):
        raise UsageError(f"{where}: \"rows\" is not a list of pattern rows; the diff file is damaged: run redis "
                         "diff again")
    summary = _mapping(data.get("summary"), f"{where}: \"summary\"")
    doc = Document(kind="redis-diff", title="kv-guardian redis diff", source=source, data=data,
                   findings=finding_views(data.get("findings"), where), created=_when(data, "created"))
    doc.facts.append(("compared", f"{summary.get('old')} → {summary.get('new')}"))
    doc.facts.append(("patterns", f"{len(rows)}"))
    return doc


def _scan_document(data: Mapping[str, Any], source: str, where: str) -> Document:
    name, version = SCAN_SCHEMA
    if data.get("schema") != name:
        raise UsageError(f"{where} has \"schema\": {json.dumps(data.get('schema'))[:60]}, which this kv-guardian "
                         f"does not read; {_WRITE_AGAIN}")
    if data.get("version") != version:
        raise UsageError(f"{where} is a Redis scan of version {data.get('version')!r}; this kv-guardian reads "
                         f"version {version}; fix: render it with the kv-guardian that wrote it, or scan again")
    patterns = data.get("patterns")
    if not isinstance(patterns, list) or not all(isinstance(p, Mapping) and isinstance(p.get("pattern"), str)
                                                 for p in patterns):
        raise UsageError(f"{where}: \"patterns\" is not a list of pattern objects; the scan file is damaged: scan "
                         "again")
    doc = Document(kind="redis-scan", title="kv-guardian redis scan", source=source, data=data,
                   findings=finding_views(data.get("findings"), where), created=_when(data, "finished", "started"))
    server = _mapping(data.get("server"), f"{where}: \"server\"")
    doc.facts.append(("target", str(data.get("target"))))
    doc.facts.append(("scanned", f"{data.get('keys_scanned')} of {data.get('dbsize')} keys in "
                                 f"{data.get('duration_s')} s ({data.get('mode')})"
                                 + ("" if data.get("complete", True) else
                                    f"; incomplete: {data.get('incomplete_reason')}")))
    if server.get("version"):
        doc.facts.append(("versions", f"Redis {server.get('version')}"))
    if data.get("redacted"):
        doc.facts.append(("key names", "redacted"))
    return doc


def _repro_document(data: Mapping[str, Any], source: str, where: str) -> Document:
    name = data.get("name")  # a reproduction's --json: {name, section, title, ok, ...its measurements}
    if not (isinstance(name, str) and isinstance(data.get("title"), str) and "section" in data
            and isinstance(data.get("ok"), bool)):
        raise UsageError(f"{where} has no \"schema\" field and is not a reproduction's --json; it is not a "
                         f"kv-guardian report: {_WRITE_AGAIN}")
    doc = Document(kind="repro", title=f"kv-guardian repro {name}: {data.get('section', '')} {data.get('title')}",
                   source=source, data=data)
    doc.findings = _nested_findings(data, where)
    doc.facts.append(("reproduction", f"{name} — {'as expected' if data.get('ok') else 'NOT as expected'}"))
    return doc


def _nested_findings(data: object, where: str, path: str = "", depth: int = 0) -> list[FindingView]:
    """Findings anywhere inside a reproduction's measurements (its own reports), with where they were."""
    out: list[FindingView] = []
    if depth > 8:
        return out
    if isinstance(data, Mapping):
        items = data.get("findings")
        if isinstance(items, list) and items and all(isinstance(f, Mapping) and "severity" in f for f in items):
            out.extend(finding_views(items, where, origin=path.strip(".") or "reproduction"))
        for k, v in data.items():
            if k != "findings":
                out.extend(_nested_findings(v, where, f"{path}.{k}", depth + 1))
    elif isinstance(data, Sequence) and not isinstance(data, str):
        for i, v in enumerate(data[:1000]):
            out.extend(_nested_findings(v, where, f"{path}[{i}]", depth + 1))
    return out
