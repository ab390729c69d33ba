"""Serving the collector for real: start_exporter over HTTP, FastAPI under uvicorn, the exporter command."""

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, make_asgi_app

from kvg_testing import ROOT, free_port
from kvguardian import Guard
from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError
from kvguardian.core.exporters.prometheus import KVGuardianCollector
from kvguardian.core.exporters.server import MetricsApp, mount_metrics, start_exporter
from kvguardian.core.findings import Finding, Report, Severity


def get(url, method="GET"):
    host, _, rest = url.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host, timeout=10)  # does not follow redirects
    conn.request(method, "/" + rest)
    resp = conn.getresponse()
    return resp.status, dict(resp.getheaders()), resp.read().decode()


def test_start_exporter_binds_loopback_and_publishes_periodic_checks():
    guard = Guard()
    info = guard.ledger.begin_request("r-1")
    guard.ledger.add_entry("blk-7", kind="block", nbytes=4096, request=info, source="pool")
    guard.ledger.end_request("r-1")  # the block outlives its request: orphaned
    with start_exporter(guard, port=0, check_interval=0.1) as exporter:
        assert exporter.host == "127.0.0.1" and exporter.url.startswith("http://127.0.0.1:")

        def orphan_found():
            body = get(exporter.url)[2]
            return 'kvguardian_findings{id="KVG102",name="orphaned-kv",severity="error"} 1.0' in body

        deadline = time.monotonic() + 10
        while not orphan_found() and time.monotonic() < deadline:
            time.sleep(0.05)
        status, headers, body = get(exporter.url)
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert 'kvguardian_kv_bytes{state="orphaned"} 4096.0' in body
    assert 'kvguardian_findings{id="KVG102",name="orphaned-kv",severity="error"} 1.0' in body
    with pytest.raises(OSError):  # closed: nothing listens any more
        urllib.request.urlopen(exporter.url, timeout=2)


def test_a_busy_port_is_an_environment_error():
    guard = Guard()
    with start_exporter(guard, port=0, check_interval=None) as first, \
            pytest.raises(UsageError, match=r"cannot serve metrics on 127\.0\.0\.1") as exc:
        start_exporter(guard, port=first.port, check_interval=None)
    assert exc.value.exit_code == EXIT_ENVIRONMENT
    with pytest.raises(UsageError, match="a guard or a collector"):
        start_exporter()


def _uvicorn(app):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    return server, thread, f"http://127.0.0.1:{port}"


def test_fastapi_route_answers_metrics_without_redirect_unlike_a_naive_mount():
    from fastapi import FastAPI

    registry = CollectorRegistry()
    collector = KVGuardianCollector()
    collector.publish([Finding("KVG207", Severity.WARNING, "idle")])
    registry.register(collector)
    app = FastAPI()

    @app.get("/health")
    def health():
        return {"ok": True}

    mount_metrics(app, registry)
    naive = FastAPI()
    naive.mount("/metrics", make_asgi_app(registry))
    servers = [_uvicorn(app), _uvicorn(naive)]
    try:
        (_, _, base), (_, _, naive_base) = servers
        status, _, body = get(base + "/metrics")
        head_status, head_headers, head_body = get(base + "/metrics", "HEAD")
        post = get(base + "/metrics", "POST")[0]
        assert get(base + "/health")[0] == 200
        naive_status, naive_headers, _ = get(naive_base + "/metrics")
    finally:
        for server, thread, _ in servers:
            server.should_exit = True
            thread.join(10)
    assert status == 200 and 'kvguardian_findings{id="KVG207",name="idle-kv-usage",severity="warning"} 1.0' in body
    assert head_status == 200 and head_body == "" and int(head_headers["content-length"]) == 0
    assert post == 405
    assert naive_status == 307 and naive_headers["location"].endswith("/metrics/")  # the pitfall mount_metrics avoids
    with pytest.raises(UsageError, match="must start with '/'"):
        mount_metrics(FastAPI(), registry, path="metrics/")


def test_metrics_app_runs_alone_under_uvicorn():
    registry = CollectorRegistry()
    registry.register(KVGuardianCollector())
    server, thread, base = _uvicorn(MetricsApp(registry))
    try:
        status, _, body = get(base + "/metrics")
    finally:
        server.should_exit = True
        thread.join(10)
    assert status == 200 and "kvguardian_exporter_source_errors_total" in body


# ---------------------------------------------------------------------------------------------- the command


def _report(path, *findings):
    path.write_text(Report(list(findings), summary={"tool": "test"}).to_json())


def test_exporter_once_prints_report_findings(tmp_path, kv_cli):
    _report(tmp_path / "scan.json", Finding("KVG301", Severity.ERROR, "cold keys", {"keys": 10}))
    code, out, err = kv_cli("exporter", "--once", "--report", str(tmp_path / "scan.json"))
    assert code == 0, err
    assert 'kvguardian_findings{id="KVG301",name="cold-no-ttl-keys",severity="error"} 1.0' in out
    assert "kvguardian_kv_bytes" not in out  # no ledger in a standalone exporter


@pytest.mark.parametrize("content", ["{not json", '{"findings": [{"id": "KVG999"}]}'])
def test_exporter_refuses_a_bad_report_in_one_line(tmp_path, kv_cli, content):
    (tmp_path / "bad.json").write_text(content)
    code, _, err = kv_cli("exporter", "--once", "--report", str(tmp_path / "bad.json"))
    assert code == 2 and "cannot read a kv-guardian JSON report" in err and len(err.strip().splitlines()) == 1


def test_exporter_serves_rereads_changed_reports_and_survives_a_broken_one(tmp_path):
    report = tmp_path / "scan.json"
    _report(report, Finding("KVG301", Severity.ERROR, "cold keys"))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvguardian", "exporter", "--port", str(port), "--report",
                             str(report)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        assert proc.stderr is not None and "serving http://127.0.0.1:" in proc.stderr.readline()
        assert 'id="KVG301",name="cold-no-ttl-keys",severity="error"} 1.0' in get(url)[2]
        _report(report, Finding("KVG302", Severity.ERROR, "explosion"), Finding("KVG302", Severity.ERROR, "again"))
        os.utime(report, (time.time() + 5, time.time() + 5))
        body = get(url)[2]
        assert 'id="KVG302",name="key-name-explosion",severity="error"} 2.0' in body
        assert 'id="KVG301",name="cold-no-ttl-keys",severity="error"} 0.0' in body
        report.write_text("{half-written")
        os.utime(report, (time.time() + 10, time.time() + 10))
        body = get(url)[2]
        assert 'id="KVG302",name="key-name-explosion",severity="error"} 2.0' in body  # the last good content
        assert 'kvguardian_exporter_source_errors_total{source="findings"} 1.0' in body
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "--report scan.json" in err
