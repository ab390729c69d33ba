"""Nothing of a tenant's data in any output: canary strings planted in prompts, API keys, cache salts and
Redis key names never appear - nor the canary's token ids - in any command's terminal or JSON output, the HTML
report, the trace and memory-snapshot exports, the Prometheus text, the logs or the re-published KV events. (No
command here was asked for raw output.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvg_tenancy import mini_server
from kvg_testing import ROOT, free_port, require_binary

CANARY = "zqxCANARY7f3Kv"
PROGRAMS = Path(__file__).parent / "programs"
pytestmark = pytest.mark.slow


def token_id_patterns(text: str) -> list[re.Pattern[str]]:
    """The canary as token-id runs: the mini server's byte ids (byte + 3) and the program's (3 + byte % 120)."""
    runs = [[b + 3 for b in text.encode()], [3 + b % 120 for b in text.encode()]]
    return [re.compile(r"\D" + r"\D{1,3}".join(str(i) for i in run[:6]) + r"\D") for run in runs]


def assert_clean(where: str, text: str) -> None:
    assert CANARY not in text, f"canary in {where}"
    assert CANARY.lower() not in text.lower(), f"canary (case-folded) in {where}"
    for pattern in token_id_patterns(CANARY):
        assert not pattern.search(f" {text} "), f"canary token ids in {where}"


def fetch(url: str, headers: dict[str, str] | None = None, body: dict | None = None) -> str:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def test_mini_server_audit_metrics_logs_and_events(kv_cli):
    key_a, key_b = f"sk-{CANARY}-a", f"sk-{CANARY}-b"
    with mini_server("--cache-mode", "per-salt", "--debug", "--api-key", f"acme={key_a}",
                     "--api-key", f"globex={key_b}") as (url, proc):
        auth = {"Authorization": f"Bearer {key_a}", "Content-Type": "application/json"}
        for stream in (False, True):
            fetch(url + "/v1/completions", auth, {"model": "kvg-mini", "prompt": f"secret {CANARY} " * 20,
                                                  "max_tokens": 3, "stream": stream, "cache_salt": CANARY})
        try:
            fetch(url + "/v1/completions", {"Authorization": f"Bearer {CANARY}-wrong"}, {"prompt": "x"})
        except urllib.error.HTTPError as exc:
            assert_clean("401 reply", exc.read().decode())
        assert_clean("/metrics", fetch(url + "/metrics"))
        assert_clean("/health", fetch(url + "/health"))
        for fmt in ((), ("--json",)):
            rc, out, err = kv_cli("isolation", "cache-sharing", "--url", url, "--model", "kvg-mini", "--key", key_a,
                                  "--key", key_b, "--salt-field", "cache_salt", "--max-rps", "100",
                                  "--max-samples", "4", "--prompt-tokens", "128", *fmt)
            assert rc in (0, 1, 4), err  # outputs, not verdicts, are under test here
            assert_clean(f"probe {fmt} stdout", out)
            assert_clean(f"probe {fmt} stderr", err)
        rc, out, err = kv_cli("isolation", "cache-sharing", "--url", url, "--model", "kvg-mini", "--key", key_a,
                              "--key", f"{CANARY}-refused", "--json")
        assert rc == 2
        assert_clean("probe error line", out + err)
    proc.wait(timeout=15)
    assert proc.stderr is not None
    assert_clean("server log", proc.stderr.read())


def test_pool_events_and_findings_in_process():
    """The events the pool re-publishes and its debug findings carry ids, hashes and counts only."""
    from fastapi.testclient import TestClient

    from kvguardian.apps.mini_server.app import MiniConfig, create_app

    app = create_app(MiniConfig(cache_mode="per-tenant", debug=True, api_keys=(f"acme={CANARY}",)))
    with TestClient(app) as client:
        r = client.post("/v1/completions", headers={"Authorization": f"Bearer {CANARY}"},
                        json={"model": "kvg-mini", "prompt": f"{CANARY} " * 30, "max_tokens": 2,
                              "cache_salt": CANARY})
        assert r.status_code == 200
        pool = app.state.mini.pool
        time.sleep(0.1)
        with app.state.mini.loop.lock:
            events = [e.to_dict() for e in pool.take_events()]
            findings = [f.to_dict() for f in pool.faults]
    assert events and any(e["kind"] == "stored" for e in events)
    assert_clean("pool events", json.dumps(events))
    assert_clean("pool findings", json.dumps(findings))


def test_run_report_json_terminal_and_prometheus(kv_cli, tmp_path):
    report = tmp_path / "report.json"
    prompts = [f"user says {CANARY} number {i}" for i in range(3)]
    page, trace, snapshot = tmp_path / "report.html", tmp_path / "trace.json", tmp_path / "kv.pickle"
    rc, out, err = kv_cli("run", "--output", str(report), "--html", str(page), "--trace", str(trace),
                          "--memory-snapshot", str(snapshot), "--", sys.executable,
                          str(PROGRAMS / "canary_server.py"), *prompts, timeout=300)
    assert rc == 1, err  # the leak is found ...
    data = report.read_text()
    assert "KVG102" in data and "MEMO" in data  # ... with its holder chain, but not the dict key
    assert_clean("run stdout and stderr", out + err)
    assert_clean("run report", data)
    html = page.read_text()
    assert "KVG102" in html and "MEMO" in html  # the page shows the finding and its chain
    assert_clean("run --html page", html)
    assert_clean("run --trace", trace.read_text())
    assert_clean("run --memory-snapshot", snapshot.read_bytes().decode("latin-1"))
    rc, text, err = kv_cli("exporter", "--once", "--report", str(report))
    assert rc == 0 and "kvguardian_findings" in text
    assert_clean("exporter --once", text + err)


@pytest.mark.services
def test_redis_scan_redacted(kv_cli, tmp_path):
    redis = pytest.importorskip("redis")
    binary = require_binary("redis-server")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, cwd=ROOT)
    try:
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        for i in range(50):
            client.set(f"session:{CANARY}:{i}", "v")
        for fmt in ((), ("--json",)):
            page = tmp_path / f"scan{len(fmt)}.html"
            rc, out, err = kv_cli("redis", "scan", f"redis://127.0.0.1:{port}/0", "--redact", "--html", str(page),
                                  *fmt)
            assert rc in (0, 1), err
            assert_clean(f"redis scan --redact {fmt}", out + err)
            assert_clean(f"redis scan --redact --html {fmt}", page.read_text())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
