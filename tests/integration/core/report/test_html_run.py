"""End to end on a real program: ``kv-guardian run --html --memory-snapshot --trace`` on a chat server with four
leaks kv-guardian has no pattern for (tests/integration/programs/leaky_server.py), then the page in Chromium and
the snapshot in PyTorch's own memory viewer."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from kvg_browser import chromium

pytestmark = [pytest.mark.slow, pytest.mark.services]

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
ROOTS = {f"module __main__: {n}" for n in ("FAILURES", "MEMO", "ON_SHUTDOWN", "SESSIONS")}


def test_run_writes_a_page_a_snapshot_and_a_trace_of_a_real_program(kv_cli, tmp_path):
    report, page = tmp_path / "kv.json", tmp_path / "kv.html"
    snap, trace = tmp_path / "kv.pickle", tmp_path / "kv-trace.json"
    rc, _, err = kv_cli("run", "--output", str(report), "--html", str(page), "--memory-snapshot", str(snap),
                        "--trace", str(trace), "--", sys.executable, str(PROGRAMS / "leaky_server.py"), "16",
                        timeout=600)
    assert rc == 1, err  # the leaks are errors
    data = json.loads(report.read_text())
    timeline = data["summary"]["processes"][0]["summary"]["timeline"]
    assert timeline["requests_seen"] == 16 and len(timeline["requests"]) == 16
    assert {r["state"] for r in timeline["requests"]} == {"orphaned"}  # every request leaked, one way or another

    with chromium() as browser, browser.open(page) as tab:
        assert tab.console_errors == [] and tab.network(page.resolve().as_uri()) == []
        facts = tab.page.evaluate("""() => ({
            roots: Object.fromEntries([...document.querySelectorAll('.holder-tree > details.holder')]
                .map(d => [d.dataset.path.split(' → ')[0], Number(d.dataset.count)])),
            series: document.querySelectorAll('svg.timeline g.series').length,
            lanes: [...document.querySelectorAll('svg.lanes g.lane')].map(g => g.dataset.state),
            cells: document.querySelectorAll('svg.heatmap rect.cell').length,
            total: Number(document.querySelector('ul.counts').dataset.total)})""")
    assert facts["roots"] == dict.fromkeys(ROOTS, 4)  # the four leaks, four requests each
    assert facts["series"] == 4 and facts["lanes"] == ["orphaned"] * 16 and facts["cells"] == 16 * 2
    assert facts["total"] == len(data["findings"])

    raw = pickle.loads(snap.read_bytes())
    alive = timeline["entries"]
    assert len(raw["segments"]) == len(alive) > 0
    assert any(f["filename"] == "held by" and f["name"].startswith("module __main__:")
               for seg in raw["segments"] for f in seg["blocks"][0]["frames"])
    out = tmp_path / "viz.html"
    proc = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(snap), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Active Memory Timeline" in out.read_text()

    events = json.loads(trace.read_text())["traceEvents"]
    assert sorted(e["name"] for e in events if e.get("cat") == "request") == sorted(
        r["id"] for r in timeline["requests"])
