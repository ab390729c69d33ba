"""Issue 13 items 12, 13 and 15 on the exporters: what is served where, bounded connections, and report files
that are not what they claim. Real HTTP over loopback; each test failed on the code before the fix."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import time

import pytest

from kvg_hostile import loris_flood
from kvg_testing import cli_command, wait_for_line
from kvguardian import Guard
from kvguardian.core.exporters.server import start_exporter
from kvguardian.core.findings import Finding, Report, Severity


def request(port: int, method: str, path: str, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_metrics_only_at_metrics_an_index_at_root_404_elsewhere_head_allowed():
    """Item 15: every path (/, /foo, /../../etc/passwd) returned the metrics and HEAD got 405."""
    with start_exporter(Guard(), port=0, check_interval=None) as exporter:
        port = exporter.port
        status, headers, body = request(port, "GET", "/metrics")
        assert status == 200 and b"kvguardian_kv_bytes" in body and headers["content-type"].startswith("text/plain")
        status, headers, body = request(port, "HEAD", "/metrics")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 100
        assert request(port, "GET", "/metrics?name[]=x")[0] == 200
        status, _, body = request(port, "GET", "/")
        assert status == 200 and b"/metrics" in body and b"kvguardian_kv_bytes" not in body
        for path in ("/foo", "/../../etc/passwd", "/metrics/", "/metricsx"):
            status, _, body = request(port, "GET", path)
            assert status == 404 and b"kvguardian" not in body, path
        status, headers, _ = request(port, "POST", "/metrics")
        assert status == 405 and headers["allow"] == "GET, HEAD"


def test_thousands_of_idle_half_requests_neither_make_threads_nor_stall_scrapes(tmp_path):
    """Item 15: 3,000 idle half-requests made 2,717 threads (≈ 118 MB) and scrapes timed out for ~5 s."""
    report = tmp_path / "r.json"
    report.write_text(Report().to_json())
    proc = subprocess.Popen(cli_command("exporter", "--port", "0", "--report", str(report)),
                            stderr=subprocess.PIPE, text=True)
    try:
        port = int(re.search(r"127\.0\.0\.1:(\d+)", wait_for_line(proc.stderr, "serving")).group(1))
        flood = loris_flood(proc.pid, port, lambda: request(port, "GET", "/metrics", timeout=10))
    finally:
        proc.terminate()
        proc.wait(10)
    assert flood["connections"] > 2500, "the flood really happened"
    status, _, body = flood["answer"]
    assert status == 200 and b"kvguardian_findings" in body
    assert flood["threads"] <= flood["baseline"] + 4, flood
    assert flood["seconds"] < 10  # a hang bound, not a speed figure: before the fix the scrape timed out


def _serve(args: list[str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(cli_command("exporter", "--port", "0", *args), stderr=subprocess.PIPE, text=True)
    port = int(re.search(r"127\.0\.0\.1:(\d+)", wait_for_line(proc.stderr, "serving")).group(1))
    return proc, port


def _findings(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    _, _, body = request(port, "GET", "/metrics")
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == "kvguardian_findings":
                out[s.labels["id"]] = s.value
            elif s.name == "kvguardian_last_check_timestamp_seconds":
                out["checked"] = s.value
    return out


def _report(created: float) -> str:
    return Report(findings=[Finding("KVG102", Severity.ERROR, "leak")], created=created).to_json()


@pytest.mark.parametrize("bad", ["null", "[1, 2]", "{}", '{"name": "pkg", "version": "1.0"}', "42", '"x"',
                                 '{"schema": 1, "tool": "kv-guardian", "created": 1, "findings": [{"id": "nope"}]}',
                                 "{half"])
def test_a_report_file_turning_invalid_keeps_its_last_good_content(tmp_path, bad):
    """Item 12: a report rewritten as null or [1,2] dropped every kvguardian_findings series (alerts resolved)."""
    path = tmp_path / "r.json"
    path.write_text(_report(1_700_000_000.0))
    proc, port = _serve(["--report", str(path)])
    try:
        assert _findings(port)["KVG102"] == 1.0
        path.write_text(bad)
        time.sleep(0.05)
        seen = _findings(port)
    finally:
        proc.terminate()
        proc.wait(10)
    assert seen["KVG102"] == 1.0 and seen["checked"] == 1_700_000_000.0


@pytest.mark.parametrize("bad, fragment", [
    ("[]", "is not a kv-guardian report"), ("42", "is not a kv-guardian report"), ('"x"', "is not a kv-guardian"),
    ("null", "is not a kv-guardian report"), ('{"name": "pkg", "dependencies": {}}', "is not a kv-guardian report"),
    ('{"schema": 1, "tool": "kv-guardian", "findings": []}', '"created" must be the Unix time'),
    ('{"schema": 1, "tool": "kv-guardian", "created": NaN, "findings": []}', "NaN is not a JSON value"),
])
def test_report_files_that_are_not_reports_are_refused_at_start(kv_cli, tmp_path, bad, fragment):
    """Items 12 and 13: `exporter --report package.json` was served as 0 findings checked "now"; [], 42, "x"
    and null were internal errors (rc 70)."""
    path = tmp_path / "r.json"
    path.write_text(bad)
    rc, _out, err = kv_cli("exporter", "--once", "--report", str(path))
    assert rc == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_a_redis_scan_file_exports_its_own_time_so_staleness_alerts_can_fire(kv_cli, tmp_path):
    """Item 12: a scan JSON carried no creation time, so the exporter exported its own load time."""
    from kvguardian.keyspace.result import ScanResult

    week_ago = time.time() - 7 * 86400
    scan = ScanResult(target="redis://127.0.0.1:6379/0", started=week_ago - 60, finished=week_ago)
    path = tmp_path / "scan.json"
    path.write_text(scan.to_json())
    assert json.loads(path.read_text())["created"] == week_ago
    rc, out, err = kv_cli("exporter", "--once", "--report", str(path))
    assert rc == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("kvguardian_last_check_timestamp_seconds ")]
    assert abs(float(line.split()[1]) - week_ago) < 1


def test_exporter_port_out_of_range_is_a_usage_error(kv_cli):
    """Item 13: `watch … --exporter-port 70000` was an internal error (OverflowError, rc 70)."""
    rc, _out, err = kv_cli("watch", "sglang", "--metrics", "http://127.0.0.1:1/metrics", "--exporter-port", "70000")
    assert rc == 2 and "--exporter-port 70000 is not a TCP port" in err, err


def test_a_bad_bind_address_says_to_fix_the_address_not_the_port(kv_cli, tmp_path):
    """Item 17: a bad address said "pick another --port"."""
    from kvguardian.core.exporters.http import MetricsHTTPServer

    path = tmp_path / "r.json"
    path.write_text(Report().to_json())
    rc, _, err = kv_cli("exporter", "--host", "203.0.113.7", "--port", "0", "--report", str(path))
    assert rc == 3 and "fix: bind an address of this machine" in err and "port" not in err.split("fix:")[1], err
    server = MetricsHTTPServer(None, "127.0.0.1", 0)
    try:
        rc, _, err = kv_cli("exporter", "--port", str(server.server_address[1]), "--report", str(path))
    finally:
        server.close()
    assert rc == 3 and "fix: pick a free port (0 picks one)" in err, err


def test_slow_routes_are_bounded_even_when_their_clients_leave():
    """A slow route (the sidecar's /drain) runs on a thread of its own, at most `slow_requests` at once; the
    slot comes back when the handler ends, so clients that ask and leave cannot pile up threads, and quick
    routes are answered meanwhile."""
    import socket
    import threading

    from kvguardian.core.exporters.http import Limits, MetricsHTTPServer, Response

    release, started = threading.Event(), []

    def slow(_request):
        started.append(1)
        release.wait(30)
        return Response(200, b"done\n")

    server = MetricsHTTPServer(None, "127.0.0.1", 0, Limits(slow_requests=2))
    server.route("/slow", slow, methods=("GET",), slow=True)
    server.route("/quick", lambda _r: Response(200, b"ok\n"))
    port = server.server_address[1]
    try:
        for _ in range(2):  # two slow requests whose clients go away at once
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 10
        while len(started) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, headers, _ = request(port, "GET", "/slow")
        assert status == 503 and headers["retry-after"] == "1"  # both slots still held by running handlers
        assert request(port, "GET", "/quick")[0] == 200
        assert request(port, "HEAD", "/slow")[0] == 405  # a slow route that acts answers no HEAD
        release.set()
        deadline = time.monotonic() + 10
        while (status := request(port, "GET", "/slow")[0]) == 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == 200 and len(started) == 3
    finally:
        release.set()
        server.close()


def test_a_burst_of_connections_is_queued_not_dropped():
    """The listen queue is the system's cap (net.core.somaxconn), not asyncio's 100: with 100, a burst of
    3,000 half-requests had about 25 SYNs dropped, each client waiting a whole TCP retransmit (1 s) to get in,
    and the flood tests took 25-30 s. ``ss`` shows a listening socket's queue length as its Send-Q."""
    import shutil
    import socket
    from pathlib import Path

    from kvguardian.core.exporters.http import MetricsHTTPServer

    if shutil.which("ss") is None:
        pytest.skip("iproute2's ss is not installed")
    server = MetricsHTTPServer(None, "127.0.0.1", 0)
    try:
        port = server.server_address[1]
        out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    finally:
        server.close()
    cap = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert out.split()[2] == str(min(socket.SOMAXCONN, cap)), out
