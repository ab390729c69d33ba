"""The HTML report in real Chromium (Debian's, through Playwright), opened from file:// as a person would:
no console errors, no network request attempted, the DOM shows what the report holds, every chart and finding is
there with JavaScript disabled, screenshots are not blank, axe-core finds nothing serious, and names with markup
in them are shown as text and never run.

Screenshots are kept under $KVG_ARTIFACT_DIR (default: this session's pytest temporary folder, artifacts/html)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvg_browser import axe_violations, chromium, pixel_stdev
from kvg_reports import synthetic_report
from kvguardian.apps.cli import main

pytestmark = pytest.mark.services

ROOTS = ("module app: SESSIONS", "frame handle() (srv.py:40) local kv")


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    folder = Path(os.environ.get("KVG_ARTIFACT_DIR") or tmp_path_factory.getbasetemp() / "artifacts") / "html"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _render(tmp_path: Path, data: dict, name: str = "report") -> Path:
    src = tmp_path / f"{name}.json"
    src.write_text(json.dumps(data))
    out = tmp_path / f"{name}.html"
    assert main(["report", str(src), "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def kv_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv-report")
    data = synthetic_report(150, leak_every=5, roots=ROOTS)
    return _render(tmp, data), data


def _dom_facts(page) -> dict:
    return page.evaluate("""() => ({
        total: Number(document.querySelector('ul.counts').dataset.total),
        bySeverity: Object.fromEntries([...document.querySelectorAll('ul.counts li')]
            .map(li => [li.dataset.severity, Number(li.dataset.count)])),
        findings: document.querySelectorAll('article.finding').length,
        groups: [...document.querySelectorAll('details.group')].map(d => Number(d.dataset.count)),
        roots: [...document.querySelectorAll('.holder-tree > details.holder')].map(d => Number(d.dataset.count)),
        series: [...document.querySelectorAll('svg.timeline g.series')].map(g => g.dataset.series),
        lanes: document.querySelectorAll('svg.lanes g.lane').length,
        cells: document.querySelectorAll('svg.heatmap rect.cell').length,
        charts: document.querySelectorAll('svg.chart').length,
        trend: document.querySelectorAll('svg.timeline line.trend').length,
    })""")


def test_kv_report_in_chromium(browser, kv_report, artifacts):
    path, data = kv_report
    with browser.open(path) as tab:
        assert tab.console_errors == []
        assert tab.network(path.resolve().as_uri()) == []
        facts = _dom_facts(tab.page)
        n = len(data["findings"])
        assert facts["total"] == n == 31
        assert facts["bySeverity"] == {"error": 30, "warning": 1, "info": 0}
        assert sorted(facts["groups"]) == [1, 15, 15]  # KVG103; KVG102 under each of the two roots
        assert sorted(facts["roots"]) == [15, 15]  # the holder tree: two roots, 15 chains each
        assert facts["series"] == ["orphaned", "retained", "live", "released"]
        assert facts["trend"] == 1
        assert facts["lanes"] == 150 and facts["cells"] == 30 * 4
        assert facts["findings"] == 2 * 5 + 1  # 5 in full per group, the rest as rows
        assert tab.page.locator("table.rows tbody tr").count() >= 20

        # JavaScript adds tooltips and zoom
        lane = tab.page.locator("svg.lanes g.lane").first
        lane.hover()
        tip = tab.page.locator(".tip")
        assert tip.is_visible() and "request r-0" in tip.inner_text()
        before = tab.page.locator("svg.timeline g.xaxis text").all_text_contents()
        tab.page.get_by_role("button", name="zoom in").first.click()
        after = tab.page.locator("svg.timeline g.xaxis text").all_text_contents()
        assert before != after
        view = tab.page.locator("svg.timeline svg.plot").first.get_attribute("viewBox")
        assert not view.startswith("0 0 ")
        assert tab.console_errors == [] and tab.network(path.resolve().as_uri()) == []

    for width in (1280, 390):
        with browser.open(path, width=width) as tab:
            shot = artifacts / f"kv-report-{width}.png"
            tab.page.screenshot(path=str(shot), full_page=True)
            assert pixel_stdev(shot) > 8, shot
            if width == 390:  # the page fits the phone's width; wide charts scroll inside their box
                assert tab.page.evaluate("document.documentElement.scrollWidth") <= 390 + 1


def test_without_javascript_every_chart_and_finding_is_there(browser, kv_report, artifacts):
    path, _data = kv_report
    with browser.open(path) as tab:
        with_js = _dom_facts(tab.page)
    with browser.open(path, js=False) as tab:
        assert tab.console_errors == [] and tab.network(path.resolve().as_uri()) == []
        without = _dom_facts(tab.page)
        assert without == with_js
        assert tab.page.locator(".zoom-bar").count() == 0
        # <details> open and close natively
        group = tab.page.locator("details.group").first
        assert group.evaluate("d => d.open")
        group.locator("summary").first.click()
        assert not group.evaluate("d => d.open")
        # hover text is the SVG <title>, which needs no script
        assert "request r-0" in tab.page.locator("svg.lanes g.lane title").first.text_content()
        shot = artifacts / "kv-report-nojs-1280.png"
        tab.page.screenshot(path=str(shot), full_page=True)
        assert pixel_stdev(shot) > 8


def test_no_serious_accessibility_violations(browser, kv_report, tmp_path):
    path, _ = kv_report
    scan = _render(tmp_path, _scan(), "scan")
    for page_path in (path, scan):
        with browser.open(page_path) as tab:
            assert axe_violations(tab.page) == [], page_path.name


def test_markup_in_names_is_shown_as_text_and_never_runs(browser, tmp_path):
    evil = "<script>window.__pwned = 1</script>"
    data = synthetic_report(12, leak_every=2, request_id=lambda i: f"{evil}{i}",
                            roots=('module app: <img src=x onerror="window.__pwned = 2">',))
    data["findings"][0]["message"] = "<iframe src=javascript:window.__pwned=3></iframe>"
    path = _render(tmp_path, data)
    for js in (True, False):
        with browser.open(path, js=js) as tab:
            assert tab.console_errors == []
            assert tab.network(path.resolve().as_uri()) == []
            if js:
                assert tab.page.evaluate("typeof window.__pwned") == "undefined"
            assert tab.page.locator("script").count() == 1  # ours
            assert tab.page.locator("img, iframe").count() == 0
            assert evil + "0" in tab.page.locator("article.finding .msg, table.rows").first.inner_text() or \
                evil + "0" in tab.page.inner_text("body")
            assert "<img src=x" in tab.page.inner_text("#holders")


def _scan() -> dict:
    patterns = [{"pattern": f"session:{{uuid}}:{name}", "keys": 1000 - 40 * i, "bytes": 400_000 - 15_000 * i,
                 "no_ttl_keys": (1000 - 40 * i) * i // 12, "cold_keys": 10 * i,
                 "ttl": {"none": (1000 - 40 * i) * i // 12, "lt_1h": 300, "lt_1d": 200},
                 "idle_s": {"p50": 30 * (i + 1), "p90": 3600, "max": 86400 * (i + 1)},
                 "idle_buckets": {"lt_1m": 10 * i, "lt_1h": 500, "ge_30d": 40 * i},
                 "top_keys": [{"key": f"session:<b>{i}</b>", "bytes": 900, "type": "hash", "ttl_ms": None}]}
                for i, name in enumerate("abcdefghijkl")]
    return {"schema": "kv-guardian/redis-scan", "version": 1, "target": "redis://127.0.0.1:6379/0", "started": 1.7e9,
            "finished": 1.7e9 + 3, "duration_s": 3, "complete": True, "mode": "lua", "keys_scanned": 9000,
            "dbsize": 9000, "patterns": patterns, "server": {"version": "7.2.4"}, "warnings": [],
            "findings": [{"id": "KVG301", "name": "cold-no-ttl-keys", "severity": "error",
                          "message": "cold keys of session:{uuid}:l", "evidence": {"pattern": "session:{uuid}:l"}}]}


def test_redis_scan_and_diff_in_chromium(browser, tmp_path, artifacts):
    path = _render(tmp_path, _scan(), "scan")
    with browser.open(path) as tab:
        assert tab.console_errors == [] and tab.network(path.resolve().as_uri()) == []
        assert tab.page.locator("svg.treemap g.tile-g").count() == 12
        assert tab.page.locator("details.pattern").count() == 12
        assert tab.page.locator("svg.treemap g.tile-g").first.get_attribute("data-pattern") == "session:{uuid}:a"
        shot = artifacts / "redis-scan-1280.png"
        tab.page.screenshot(path=str(shot), full_page=True)
        assert pixel_stdev(shot) > 8
    rows = [{"pattern": f"p:{i}", "bytes_delta": (i - 3) * 5000, "keys_delta": i - 3, "bytes_old": 10_000,
             "bytes_new": 10_000 + (i - 3) * 5000, "new_pattern": i == 7} for i in range(8)]
    diff = {"schema": 1, "tool": "kv-guardian", "created": 1.7e9, "rows": rows, "warnings": ["OLD is incomplete"],
            "summary": {"old": "a.json", "new": "b.json"}, "counts": {}, "findings": []}
    path = _render(tmp_path, diff, "diff")
    with browser.open(path, js=False) as tab:
        assert tab.console_errors == [] and tab.network(path.resolve().as_uri()) == []
        assert tab.page.locator("svg.growth-chart g.growth").count() == 8
        assert "OLD is incomplete" in tab.page.inner_text("#warnings")


def test_a_100k_request_run_stays_small_and_opens(browser, tmp_path):
    data = synthetic_report(100_000, leak_every=997, max_lanes=100_000)
    path = _render(tmp_path, data, "big")
    assert path.stat().st_size <= 2_000_000
    with browser.open(path) as tab:
        assert tab.console_errors == []
        assert tab.page.locator("svg.lanes g.lane").count() <= 400
        assert "of 100000 requests shown" in tab.page.inner_text("figure.lanes-figure")
