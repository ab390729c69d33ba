"""kv-guardian watch sglang against a real HTTP server serving SGLang's scheduler gauges."""

import json
import subprocess
import sys
import threading
import urllib.request

from engine_fakes import MetricsServer, SglangMetrics, wait_until
from kvg_testing import ROOT
from kvguardian.core.exporters.server import start_exporter
from kvguardian.runtime.engines.watch import Watch
from kvguardian.runtime.engines.watch_exporter import WatchCollector


def test_over_count_and_idle_leak_are_found_and_exported():
    sg = SglangMetrics(total=10_000)
    sg.set(available=6_000, evictable=1_000, used=3_000, running=4, queued=2)
    server = MetricsServer(sg.registry)
    watch = Watch("sglang", server.url, interval=0.05, grace=0.3, confirm=2)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    exporter = start_exporter(collector=WatchCollector(watch), port=0)
    try:
        assert wait_until(lambda: watch.scrapes >= 5)
        assert not watch.board.all()  # busy and conserved
        sg.set(available=7_000, evictable=1_000, used=3_000, running=4, queued=0)  # 1,000 tokens counted twice
        assert wait_until(lambda: any("exceeds" in f.message for f in watch.board.active()))
        sg.set(available=9_000, evictable=500, used=0, running=0, queued=0)  # idle, 500 tokens gone missing
        assert wait_until(lambda: any("memory leak" in f.message for f in watch.board.active()))
        text = urllib.request.urlopen(exporter.url, timeout=5).read().decode()
    finally:
        exporter.close()
        watch.stop()
        thread.join(10)
        server.close()
    assert "kvguardian_watch_sglang_unaccounted_tokens 500.0" in text
    assert 'kvguardian_findings{id="KVG206",name="conservation-violated",severity="error"} 1.0' in text
    report = watch.report()
    over, idle = report.findings
    assert over.evidence["resolved_after_seconds"] > 0 and over.evidence["excess_tokens"] == 1_000
    assert idle.evidence["unaccounted_tokens"] == 500 and "resolved_after_seconds" not in idle.evidence


def test_cli_healthy_server_exits_0_and_leaking_server_exits_1():
    sg = SglangMetrics(total=4_096)
    server = MetricsServer(sg.registry)
    cmd = [sys.executable, "-m", "kvguardian", "watch", "sglang", "--metrics", server.url, "--interval", "0.1",
           "--grace", "0.3", "--duration", "1.2", "--json"]
    try:
        healthy = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
        sg.set(available=4_000, evictable=0, used=96, running=0, queued=0)
        leaking = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    finally:
        server.close()
    assert healthy.returncode == 0, healthy.stderr
    assert json.loads(healthy.stdout)["findings"] == []
    assert leaking.returncode == 1, leaking.stderr
    (f,) = json.loads(leaking.stdout)["findings"]
    assert f["id"] == "KVG206" and "96 tokens are locked as used" in f["message"]


def test_cli_refuses_event_flags_for_sglang():
    proc = subprocess.run([sys.executable, "-m", "kvguardian", "watch", "sglang", "--metrics",
                           "http://127.0.0.1:9/metrics", "--events", "tcp://127.0.0.1:5557"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "unrecognized arguments: --events" in proc.stderr
