"""The HTML report as a pure function of report JSON: escaping, grouping, bounded output, and the parts each
report kind shows. The browser tests (tests/integration/core/report) check what a person sees."""

from __future__ import annotations

import json
import re

import pytest

from kvg_reports import synthetic_report
from kvguardian.apps.cli.report import redact_report as redact_data
from kvguardian.core.report.document import FindingView, classify
from kvguardian.core.report.history import read_history
from kvguardian.core.report.html import render_html
from kvguardian.core.report.html.decimate import buckets, pick, thin_rows
from kvguardian.core.report.html.holders import build_tree, fold_step, render_tree
from kvguardian.core.report.html.markup import text
from kvguardian.core.report.html.treemap import squarify
from kvguardian.core.report.redact import redact_text


def _finding(chain, rid="r", nbytes=10, fid="KVG102"):
    return FindingView(fid, "orphaned-kv", "error", "m", {"request_id": rid, "bytes": nbytes}, tuple(chain), "fix")


def test_text_escapes_markup_and_makes_control_characters_visible():
    assert text("<script>alert('x')</script>") == "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    assert text("a\nb\x1b[2J\u202e\ud800") == "a\\nb\\x1b[2J\\u202e\\ud800"
    assert text('"&') == "&quot;&amp;"


def test_holder_tree_groups_by_root_and_folded_path():
    findings = [_finding(["module app: SESSIONS", f"dict['user-{i}']", "Session.cache", "DynamicCache.layers"],
                         f"r{i}") for i in range(36)]
    findings += [_finding(["module app: SESSIONS", f"dict['user-{i}']", "Session.history", "list[0]"], f"h{i}")
                 for i in range(4)]
    findings += [_finding(["frame handle() (srv.py:40) local kv", "DynamicCache.layers"], f"f{i}") for i in range(5)]
    root = build_tree(findings)
    assert {k: n.count for k, n in root.children.items()} == {"module app: SESSIONS": 40,
                                                              "frame handle() (srv.py:40) local kv": 5}
    sessions = root.children["module app: SESSIONS"].children["dict[…]"]
    assert sessions.count == 40 and sessions.bytes == 400
    assert {k: n.count for k, n in sessions.children.items()} == {"Session.cache": 36, "Session.history": 4}
    html = render_tree(findings)
    counts = [int(c) for c in re.findall(r'data-count="(\d+)"', html)]
    assert counts[:2] == [40, 36] and 4 in counts and 5 in counts
    assert fold_step("Tensor[1×2×8×16] float32") == "Tensor[…] float32"


def test_treemap_areas_are_proportional_and_fill_the_box():
    values = [50.0, 25.0, 12.5, 6.25, 6.25]
    rects = squarify(values, 0, 0, 400, 200)
    areas = [w * h for _, _, w, h in rects]
    assert sum(areas) == pytest.approx(400 * 200)
    for a, v in zip(areas, values):
        assert a == pytest.approx(400 * 200 * v / 100)
    for x, y, w, h in rects:
        assert x >= 0 and y >= 0 and x + w <= 400 + 1e-6 and y + h <= 200 + 1e-6


def test_decimation_keeps_peaks_and_bounds():
    rows = [[float(i), float(i % 97 == 0) * 1000, 0, 0, 0] for i in range(10_000)]
    thin = thin_rows(rows, 500, value_cols=(1, 2, 3))
    assert len(thin) <= 500
    assert sum(r[1] for r in thin) == sum(r[1] for r in rows)  # every spike survives (they are far apart)
    items = list(range(1000))
    chosen, left = pick(items, 100, must=lambda x: x % 50 == 0)
    assert len(chosen) == 100 and left == 900 and all(x in chosen for x in range(0, 1000, 50))
    assert buckets([0, 1, 2, 10], 0, 10, 5) == [2, 1, 0, 0, 1]


def test_guard_report_page_has_every_part():
    data = synthetic_report(120, leak_every=4, roots=("module app: SESSIONS", "frame handle() (a.py:1) local kv"))
    html = render_html(data)
    assert html.startswith("<!DOCTYPE html>")
    assert 'data-total="31"' in html  # 30 KVG102 + 1 KVG103 in the header counts
    assert html.count('class="series"') == 4
    assert 'data-finding="KVG103"' in html  # the trend line
    assert 'class="lanes-figure" data-lanes="120"' in html
    assert 'data-cells="120"' in html  # 30 requests x 4 layers
    assert 'data-chains="30" data-roots="2"' in html
    # nothing to load: the only URL is the SVG namespace the script creates elements in
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}
    assert "default-src &#x27;none&#x27;" in html  # the policy (attribute-escaped)


def test_a_large_run_is_bounded():
    data = synthetic_report(20_000, leak_every=1000, max_lanes=20_000)
    html = render_html(data)
    assert len(html.encode()) < 2_000_000
    assert html.count('class="lane ') <= 400
    assert "of 20000 requests shown" in html


def test_names_with_markup_are_text():
    data = synthetic_report(10, leak_every=2, request_id=lambda i: f"<script>alert({i})</script>",
                            roots=("module app: <img src=x onerror=alert(1)>",))
    html = render_html(data)
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(0)&lt;/script&gt;" in html


def test_empty_run_and_no_timeline():
    empty = synthetic_report(0)
    html = render_html(empty)
    assert "No findings" in html and "No timeline samples" in html
    html = render_html({"schema": 1, "tool": "kv-guardian", "summary": {"requests_seen": 0}, "findings": []})
    assert "has no KV timeline" in html


def test_a_damaged_timeline_keeps_the_findings():
    data = synthetic_report(20, leak_every=2)
    data["summary"]["timeline"]["samples"][3] = ["x"]
    html = render_html(data)
    assert "damaged and is not drawn" in html
    assert 'data-total="10"' in html


def test_redis_scan_and_diff_pages():
    patterns = [{"pattern": f"sess:{{uuid}}:{i}", "keys": 100 - i, "bytes": 10_000 * (50 - i), "no_ttl_keys": i * 2,
                 "cold_keys": 1, "ttl": {"none": i * 2, "lt_1h": 100 - 3 * i}, "idle_s": {"p50": 5, "p90": 600,
                                                                                          "max": 86400},
                 "top_keys": [{"key": f"sess:<b>{i}</b>", "bytes": 99, "type": "string", "ttl_ms": None}]}
                for i in range(40)]
    scan = {"schema": "kv-guardian/redis-scan", "version": 1, "target": "redis://127.0.0.1:1/0", "started": 1.0,
            "finished": 2.0, "complete": True, "patterns": patterns, "findings": [], "warnings": ["w1"]}
    html = render_html(scan)
    assert html.count('class="tile-g"') == 40
    assert 'class="pattern"' in html and html.count('class="bin"') == 8 * 30  # TTL bins; idle as p50/p90/max
    assert html.count('class="quantile"') == 3 * 30
    patterns[0]["idle_buckets"] = {"lt_1m": 3, "lt_1h": 7, "ge_30d": 1}  # scans that have the idle histogram
    html = render_html(scan)
    assert html.count('class="bin"') == 8 * 30 + 7 and html.count('class="quantile"') == 3 * 29
    assert "sess:&lt;b&gt;0&lt;/b&gt;" in html
    rows = [{"pattern": f"p{i}", "bytes_delta": (i - 5) * 100, "keys_delta": i, "bytes_old": 1, "bytes_new": 2}
            for i in range(10)]
    diff = {"schema": 1, "tool": "kv-guardian", "rows": rows, "summary": {"old": "a", "new": "b"}, "findings": []}
    html = render_html(diff)
    assert html.count('class="growth"') == 10


def test_pool_metrics_in_a_reproduction_are_drawn():
    metrics = {"blocks_total": 64, "blocks_free": 40, "blocks_cached": 8, "blocks_referenced": 16,
               "blocks_orphaned": 4}
    repro = {"name": "cross-request", "section": "§2.2", "title": "t", "ok": True,
             "checks": {"buggy": {"metrics": metrics, "first_fault": {"id": "KVG202", "name": "use-after-free-write",
                                                                      "request_id": "r-9", "block": 3,
                                                                      "operation": "write", "message": "m"}}}}
    html = render_html(repro)
    assert 'data-pools="1"' in html and "First bad operation" in html and "r-9" in html


def test_redact_hides_dictionary_keys_like_the_chain_search():
    assert redact_text("dict['user-42'] → Session.cache") == "dict[<str len=7>] → Session.cache"
    assert redact_text("dict[17]") == "dict[<key>]"
    assert redact_text("dict[('a', 3)]") == "dict[(<str len=1>, <key>)]"
    assert redact_text("dict[<str len=3>]") == "dict[<str len=3>]"
    assert redact_text("dict[('s0',)]") == "dict[(<str len=2>,)]"
    assert redact_text("dict[<class Req3>]") == "dict[<type>]"  # the search's redacted form of a class key
    data = synthetic_report(10, leak_every=2)
    assert "user-0" not in json.dumps(redact_data(data))


def test_history_reader_rejects_other_versions():
    from kvguardian.core.errors import UsageError

    tl = synthetic_report(3)["summary"]["timeline"]
    assert len(read_history(tl).requests) == 3
    with pytest.raises(UsageError, match="timeline version 9"):
        read_history({**tl, "version": 9})
    assert classify(synthetic_report(3)).audits[0].timeline is not None


def test_html_reporter_draws_the_result_and_keeps_the_command_output():
    import io

    from kvguardian.core.findings import Finding, Report
    from kvguardian.core.report.html.reporter import HtmlReporter

    out = io.StringIO()
    rep = HtmlReporter(out)
    rep.heading("<b>scan</b>")
    rep.text("3 patterns")
    rep.table("top patterns", ["pattern", "keys"], [["s:<i>x</i>", 3], ["t:{uuid}", 5]])
    rep.finding(Finding("KVG102", "error", "live line"))
    rep.result(synthetic_report(8, leak_every=2))
    rep.close()
    html = out.getvalue()
    assert 'data-total="4"' in html and 'class="lanes-figure"' in html  # the result, drawn as a report
    assert "Command output" in html and "&lt;b&gt;scan&lt;/b&gt;" in html and "s:&lt;i&gt;x&lt;/i&gt;" in html
    # no result: the findings it was given (or saw live) are the page
    out = io.StringIO()
    rep = HtmlReporter(out)
    rep.finding(Finding("KVG207", "warning", "idle KV"))
    rep.close()
    assert 'data-total="1"' in out.getvalue()
    out = io.StringIO()
    rep = HtmlReporter(out)
    rep.findings(Report(findings=[Finding("KVG102", "error", "m")]))
    rep.result({"rows": "not a report"})  # a result no report kind matches
    rep.close()
    assert 'data-total="1"' in out.getvalue()


def test_redact_a_redis_scan_like_scan_redact():
    from kvguardian.keyspace.redact import Redactor

    scan = {"schema": "kv-guardian/redis-scan", "version": 1, "target": "redis://127.0.0.1:1/0", "started": 1.0,
            "finished": 2.0, "patterns": [{"pattern": "tenant-alice:{uuid}", "keys": 20, "bytes": 10,
                                           "example_key": "tenant-alice:4f1c",
                                           "top_keys": [{"key": "tenant-alice:4f1c", "bytes": 5}]}],
            "findings": [{"id": "KVG305", "severity": "info", "message": "20 keys of tenant-alice:{uuid} have no TTL",
                          "evidence": {"pattern": "tenant-alice:{uuid}", "example_key": "tenant-alice:4f1c"}}]}
    out = redact_data(scan)
    assert "alice" not in json.dumps(out)
    hashed = Redactor().pattern("tenant-alice:{uuid}")
    assert out["patterns"][0]["pattern"] == hashed and hashed in out["findings"][0]["message"]
    assert out["redacted"] is True and "alice" in json.dumps(scan)  # a copy: the input is untouched
    assert "alice" not in render_html(out)
