"""The exporter over real HTTP: O(1) gauges per scrape, the last completed scan, never a scan in a scrape."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest
from kvg_redis import free_port, require_binary, seed

from kvguardian.keyspace.exporter import Exporter
from kvguardian.keyspace.scan import ScanOptions

pytestmark = pytest.mark.services


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in the exposition")


def test_exporter_serves_info_gauges_and_the_last_completed_scan(redis_proc):
    r = redis_proc.client()
    seed(r)
    exporter = Exporter(redis_proc.url, ScanOptions(cold_after=3600), interval=3600)
    host, port = exporter.serve(free_port())
    assert host == "127.0.0.1"
    try:
        before = _scrape(port)
        assert _value(before, "kvguardian_redis_up") == 1.0
        assert _value(before, 'kvguardian_redis_keys{db="db0"}') == r.dbsize()
        assert _value(before, 'kvguardian_redis_keys_without_ttl{db="db0"}') == 440  # 200+150+60+30
        assert "kvguardian_redis_pattern_keys" not in before  # no scan has completed yet
        exporter.start()
        deadline = time.monotonic() + 30
        while exporter.last is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exporter.last is not None
        scans = r.info("commandstats")["cmdstat_scan"]["calls"]
        text = _scrape(port)
        text2 = _scrape(port)
        assert r.info("commandstats")["cmdstat_scan"]["calls"] == scans  # scrapes never SCAN
        assert _value(text, 'kvguardian_redis_pattern_keys{pattern="tmp_{ts_ns}"}') == 150
        assert _value(text2, 'kvguardian_redis_pattern_no_ttl_keys{pattern="user:{int}:profile"}') == 200
        assert _value(text, "kvguardian_redis_sweep_complete") == 1.0
        assert _value(text, "kvguardian_redis_sweep_timestamp_seconds") > time.time() - 120
        promtool = require_binary("promtool")
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
    finally:
        exporter.close()


def test_exporter_bounds_pattern_labels_and_reports_a_dead_server(redis_proc):
    r = redis_proc.client()
    seed(r)
    exporter = Exporter(redis_proc.url, ScanOptions(), interval=3600, top=2)
    _, port = exporter.serve(free_port())
    try:
        exporter.scan_once()
        text = _scrape(port)
        labels = [ln for ln in text.splitlines() if ln.startswith("kvguardian_redis_pattern_keys{")]
        assert len(labels) == 3 and any('pattern="{other}"' in ln for ln in labels)
        assert sum(float(ln.split()[-1]) for ln in labels) == r.dbsize()
        redis_proc.stop()
        down = _scrape(port)
        assert _value(down, "kvguardian_redis_up") == 0.0
        assert _value(down, 'kvguardian_redis_pattern_keys{pattern="{other}"}') > 0  # the last scan stays
    finally:
        exporter.close()


def test_exporter_cli_binds_loopback_and_stops_on_sigterm(redis_proc):
    seed(redis_proc.client())
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvguardian", "redis", "exporter", redis_proc.url,
                             "--port", str(port), "--interval", "1h", "--redact"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        assert f"serving http://127.0.0.1:{port}/metrics" in line, line
        deadline = time.monotonic() + 30
        while "kvguardian_redis_pattern_keys" not in (text := _scrape(port)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert "session" not in text and "tmp_" not in text and "{uuid}" in text  # --redact
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_every_exported_family_is_in_the_catalog_with_its_labels(redis_proc):
    """The catalog is the one list of metrics (the Grafana --check and the README read it)."""
    from prometheus_client.parser import text_string_to_metric_families

    from kvguardian.core.exporters.catalog import by_name, names

    r = redis_proc.client()
    seed(r)
    exporter = Exporter(redis_proc.url, ScanOptions(cold_after=3600), interval=3600)
    _, port = exporter.serve(free_port())
    try:
        exporter.start()
        deadline = time.monotonic() + 30
        while exporter.last is None and time.monotonic() < deadline:
            time.sleep(0.05)
        text = _scrape(port)
    finally:
        exporter.close()
    families = set()
    for fam in text_string_to_metric_families(text):
        families.add(fam.name)
        for s in fam.samples:
            spec = by_name(s.name)
            assert spec.owner == "redis"
            assert set(s.labels) == set(spec.labels), s
    assert families == {by_name(n).family_name for n in names("redis")}
