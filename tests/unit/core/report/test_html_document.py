"""Reading report files: every kind kv-guardian writes is classified; another schema or version, a truncated or
damaged file, and non-reports are one clear UsageError line."""

from __future__ import annotations

import json

import pytest

from kvg_reports import synthetic_report
from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Finding, Report
from kvguardian.core.report.document import classify, load_document, parse_document


def _write(tmp_path, name, body):
    p = tmp_path / name
    p.write_text(body if isinstance(body, str) else json.dumps(body))
    return p


def test_guard_report_of_a_real_report_object():
    rep = Report(findings=[Finding("KVG102", "error", "leak", {"request_id": "r-1", "bytes": 10},
                                   holder_chain=["module app: X", "dict['a']"])],
                 summary={"requests_seen": 2, "entries": 1})
    doc = classify(json.loads(rep.to_json()))
    assert doc.kind == "guard"
    assert [f.id for f in doc.findings] == ["KVG102"]
    assert doc.findings[0].holder_chain == ("module app: X", "dict['a']")
    assert len(doc.audits) == 1 and doc.audits[0].timeline is None


def test_run_report_findings_are_attributed_to_their_process():
    data = {"schema": 1, "tool": "kv-guardian", "created": 1.0, "counts": {},
            "summary": {"program": {"argv": ["python", "app.py"], "exit_code": 0, "seconds": 1.5},
                        "processes": [{"pid": 11, "status": "audited", "summary": {"requests_seen": 3}},
                                      {"pid": 12, "status": "audited", "summary": {"requests_seen": 0}}],
                        "unaudited_pids": [13]},
            "findings": [{"id": "KVG102", "severity": "error", "message": "m", "evidence": {"pid": 12}}]}
    doc = classify(data)
    assert doc.kind == "run"
    assert doc.title.endswith("python app.py")
    assert [len(a.findings) for a in doc.audits] == [0, 1]
    assert doc.findings[0].origin == "pid 12"
    assert ("not audited", "13") in doc.facts


def test_pytest_json_lines_keep_complete_lines_when_the_last_is_cut(tmp_path):
    lines = [json.dumps({"test": f"t.py::test_{i}", **synthetic_report(4, leak_every=2)}) for i in range(3)]
    body = "\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2]
    doc = load_document(_write(tmp_path, "kv.jsonl", body))
    assert doc.kind == "pytest"
    assert [a.label for a in doc.audits] == ["t.py::test_0", "t.py::test_1"]
    assert len(doc.findings) == 4
    assert doc.notes and "line 3" in doc.notes[0]


def test_damage_inside_json_lines_is_refused(tmp_path):
    good = json.dumps({"test": "t::a", **synthetic_report(2)})
    with pytest.raises(UsageError, match="not valid JSON"):
        load_document(_write(tmp_path, "kv.jsonl", good + "\n{broken\n" + good + "\n"))


@pytest.mark.parametrize(("body", "message"), [
    ({"schema": 2, "tool": "kv-guardian", "summary": {}}, "schema version 2; this kv-guardian reads version 1"),
    ({"schema": "kv-guardian/redis-scan", "version": 7, "patterns": []}, "Redis scan of version 7"),
    ({"schema": "other/thing", "version": 1}, "which this kv-guardian does not read"),
    ({"schema": 1, "tool": "memray"}, "not a kv-guardian report"),
    ({"hello": "world"}, "no \"schema\" field"),
    ([1, 2, 3], "JSON list, not a kv-guardian report"),
    ({"schema": 1, "tool": "kv-guardian", "summary": [], "findings": []}, "not an object"),
    ({"schema": 1, "tool": "kv-guardian", "summary": {}, "findings": [{"id": "KVG102"}]}, "finding 0 has no"),
    ({"schema": 1, "tool": "kv-guardian", "summary": {}, "findings": [{"id": "KVG1", "message": "m",
                                                                       "severity": "fatal"}]}, "severity 'fatal'"),
])
def test_other_schemas_and_damaged_reports_are_one_line(tmp_path, body, message):
    with pytest.raises(UsageError, match=message) as err:
        load_document(_write(tmp_path, "r.json", body))
    assert "\n" not in str(err.value)


def test_truncated_empty_and_binary_files(tmp_path):
    full = json.dumps(synthetic_report(10))
    with pytest.raises(UsageError, match="truncated or damaged"):
        load_document(_write(tmp_path, "a.json", full[:-40]))
    with pytest.raises(UsageError, match="is empty"):
        load_document(_write(tmp_path, "b.json", "  \n"))
    p = tmp_path / "c.json"
    p.write_bytes(b"\xff\xfe{}")
    with pytest.raises(UsageError, match="not UTF-8"):
        load_document(p)
    with pytest.raises(UsageError, match="cannot read"):
        load_document(tmp_path / "missing.json")
    with pytest.raises(UsageError, match="nests JSON too deeply"):
        parse_document("[" * 100_000 + "]" * 100_000)


def test_scan_diff_watch_and_repro_kinds():
    scan = {"schema": "kv-guardian/redis-scan", "version": 1, "target": "redis://127.0.0.1:6379/0", "started": 1.0,
            "finished": 2.0, "complete": True, "patterns": [{"pattern": "s:{uuid}", "keys": 3, "bytes": 10}],
            "findings": [], "server": {"version": "7.2.4"}}
    assert classify(scan).kind == "redis-scan"
    diff = {"schema": 1, "tool": "kv-guardian", "rows": [{"pattern": "s:{uuid}", "bytes_delta": 5}], "warnings": [],
            "summary": {"old": "a.json", "new": "b.json"}, "findings": []}
    assert classify(diff).kind == "redis-diff"
    watch = {"schema": 1, "tool": "kv-guardian", "summary": {"engine": "vllm", "metrics_url": "http://x/metrics"},
             "findings": []}
    assert classify(watch).kind == "watch"
    repro = {"name": "orphaned", "section": "", "title": "t", "ok": True,
             "variants": {"buggy": {"report": {"findings": [{"id": "KVG102", "severity": "error", "message": "m"}]}}}}
    doc = classify(repro)
    assert doc.kind == "repro"
    assert [(f.id, f.origin) for f in doc.findings] == [("KVG102", "variants.buggy.report")]


def test_findings_of_a_newer_kv_guardian_are_kept():
    data = {"schema": 1, "tool": "kv-guardian", "summary": {},
            "findings": [{"id": "KVG999", "name": "future", "severity": "warning", "message": "new"}]}
    assert [f.id for f in classify(data).findings] == ["KVG999"]
