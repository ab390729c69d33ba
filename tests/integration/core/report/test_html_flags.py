"""``--html FILE`` on the commands that write results, through the HTML reporter: watch (a real HTTP metrics
server on loopback), a reproduction, and the pytest plugin's ``--kv-html`` (a real pytest session)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from engine_fakes import MetricsServer, VllmMetrics
from kvg_testing import ROOT


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kvguardian", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_watch_html_has_the_findings_seen_live(tmp_path):
    metrics = VllmMetrics()
    metrics.set(running=0, waiting=0, usage=0.2)  # idle with KV in use: KVG207 after the grace
    server = MetricsServer(metrics.registry)
    page = tmp_path / "watch.html"
    try:
        proc = _cli("watch", "vllm", "--metrics", server.url, "--interval", "0.1", "--grace", "0.2",
                    "--duration", "1.5", "--html", str(page))
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    assert 'data-kind="watch"' in html and 'data-id="KVG207"' in html and 'data-total="1"' in html
    assert "KVG207 idle-kv-usage (warning)" in proc.stdout  # the terminal output is unchanged


def test_repro_html_draws_its_reports(tmp_path):
    page = tmp_path / "repro.html"
    proc = _cli("repro", "orphaned", "--requests", "16", "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    assert 'data-kind="repro"' in html and "Command output" in html  # its measurements, and what it printed
    assert re.search(r"<dt>KVG102</dt><dd>16</dd>", html)  # the buggy variant's findings, as counted
    bad = _cli("repro", "orphaned", "--html", str(ROOT / "missing" / "x.html"))
    assert bad.returncode == 2 and "--html" in bad.stderr


def test_pytest_kv_html_writes_the_session(tmp_path):
    tests = tmp_path / "test_leaks.py"
    tests.write_text(
        "import pytest, torch\n"
        "KEPT = {}\n"
        "@pytest.mark.kv_no_leak\n"
        "def test_leaks(kv_guard):\n"
        "    k = torch.zeros(1, 2, 4, 8)\n"
        "    with kv_guard.request('r-leak'):\n"
        "        kv_guard.track(k, k.clone(), layer=0)\n"
        "    KEPT['<b>key</b>'] = k\n"
        "@pytest.mark.kv_no_leak\n"
        "def test_clean(kv_guard):\n"
        "    with kv_guard.request('r-ok'):\n"
        "        kv_guard.track(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8), layer=0)\n"
    )
    page = tmp_path / "session.html"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
                           str(tests), f"--kv-html={page}"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout  # test_leaks fails
    assert f"HTML report of 2 checked test(s): {page}" in proc.stdout
    html = page.read_text()
    assert 'data-kind="pytest"' in html and "test_leaks.py::test_leaks" in html and 'data-id="KVG102"' in html
    assert "<b>key</b>" not in html
    bad = subprocess.run([sys.executable, "-m", "pytest", "-q", str(tests), "--kv-html=/nonexistent/x.html"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 4 and "--kv-html" in bad.stderr + bad.stdout


@pytest.mark.parametrize("flag", ["--html", "--memory-snapshot", "--trace"])
def test_run_checks_its_outputs_before_the_program_starts(tmp_path, flag):
    marker = tmp_path / "ran"
    proc = _cli("run", flag, str(tmp_path / "missing" / "out"), "--", sys.executable, "-c",
                f"open({str(marker)!r}, 'w')")
    assert proc.returncode == 2 and flag in proc.stderr
    assert not marker.exists()
