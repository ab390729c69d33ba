"""A real Prometheus over the two real vLLM servers: the shipped scrape config and rules, both servers' /metrics,
both in-process audits and one `kv-guardian watch` following both replicas. A leak injected into one replica
(the faulty server's fault plugin drops the free of aborted requests) fires the alerts for that replica only,
read back through Prometheus's HTTP API, and the Grafana dashboard's queries are run against it.

Test-only changes to what ships, and why: the global scrape and evaluation intervals are 1 s (15 s shipped),
and the rules are a copy with every duration divided by 60 (`prometheus_server.scaled`: VLLMKVUsageWhileIdle's
10-minute windows and 5-minute ``for:`` become 10 s and 5 s; KVGuardianErrorFinding's ``for: 10m`` 10 s), so the
alerts fire within a minute; their expressions are the shipped ones. The time from the leak to each alert is
measured and printed, never asserted.

Named test_fleet_* so that it runs before the test_real_* files, which leak on the faulty server too: the
leak measured here is then the first (when it is not, the test says so and still checks which replica fires).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest
from prometheus_server import SCALE, Prometheus
from vllm_server import NUM_BLOCKS

from engine_fakes import wait_until
from kvg_testing import ROOT, free_port, require_binary

DASHBOARD = ROOT / "deploy" / "grafana" / "kvguardian-dashboard.json"
ALERTS = ("VLLMKVUsageWhileIdle", "KVGuardianErrorFinding")
RATE_INTERVAL = "30s"  # what Grafana would put for $__rate_interval at a 1 s scrape interval over a short range


def replica(server) -> str:
    return f"127.0.0.1:{server.port}"


def idle_usage(server) -> float:
    """KV usage while nothing runs or waits (0 when busy: only an idle reading says "leak")."""
    busy = server.gauge("vllm:num_requests_running") + server.gauge("vllm:num_requests_waiting")
    return 0.0 if busy else server.gauge("vllm:kv_cache_usage_perc")


def dashboard_exprs() -> list[str]:
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                found.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(DASHBOARD.read_text()))
    return found


@pytest.fixture(scope="module")
def fleet(servers, clean, faulty):
    """Prometheus scraping 5 targets (2 vLLM, 2 audits, 1 fleet watcher following both replicas)."""
    binary = require_binary("prometheus")
    watch_port = free_port()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "kvguardian", "watch", "vllm", "--metrics", clean.metrics_url, "--metrics",
         faulty.metrics_url, "--events", clean.events, "--events", servers.faulty_events, "--events-bind",
         servers.faulty_events, "--replay", clean.replay, "--replay", faulty.replay, "--topic", "kv",
         "--interval", "1", "--grace", "5", "--exporter-port", str(watch_port), "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prom = Prometheus(servers.run_dir, {
        "vllm": [{"targets": [replica(clean), replica(faulty)]}],
        "kvguardian-audit": [
            {"targets": [f"127.0.0.1:{servers.clean_audit_port}"], "labels": {"replica": replica(clean)}},
            {"targets": [f"127.0.0.1:{servers.faulty_audit_port}"], "labels": {"replica": replica(faulty)}}],
        "kvguardian-watch": [{"targets": [f"127.0.0.1:{watch_port}"]}],
    })
    try:
        print(f"\nprometheus ready in {prom.start(binary):.1f} s at {prom.url} ({prom.dir})")
        yield prom
    finally:
        prom.stop()
        if watcher.poll() is None:
            watcher.send_signal(signal.SIGTERM)  # the process we started, by PID
            try:
                watcher.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                watcher.kill()
                watcher.communicate(timeout=10)


def _targets_up(prom: Prometheus) -> bool:
    active = prom.api("targets")["activeTargets"]
    return len(active) == 5 and all(t["health"] == "up" for t in active)


def _firing(prom: Prometheus, name: str) -> list[dict]:
    return [a for a in prom.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"]


def _leak(clean, faulty) -> float:
    """Aborted streams on both replicas (the same traffic); the faulty one loses their frees. Returns the unix
    time the leak started (the last round's streams dropped). A stream vLLM finished before it saw the
    disconnect is not aborted: another round, at most three."""
    for seed in (101, 102, 103):  # one stream each: a few blocks, so later tests keep most of the 64-block pool
        clean.abort_streams(1, seed=seed)
        faulty.abort_streams(1, seed=seed)
        started = time.time()
        if wait_until(lambda: idle_usage(faulty) > 0, timeout=20, step=0.2):
            return started
    raise AssertionError("three rounds of dropped streams never left KV held on the faulty replica")


def test_a_leak_on_one_replica_fires_its_alerts_and_no_other(fleet, clean, faulty):
    prom = fleet
    names = {r["name"] for g in prom.api("rules")["groups"] for r in g["rules"]}
    assert set(ALERTS) <= names, sorted(names)
    assert wait_until(lambda: _targets_up(prom), timeout=30, step=0.5), prom.api("targets")["activeTargets"]
    leaked_before = idle_usage(faulty) > 0
    assert idle_usage(clean) == 0.0
    t_leak = _leak(clean, faulty)
    print(f"\nleaked on {replica(faulty)}: {round(idle_usage(faulty) * (NUM_BLOCKS - 1))} block(s) held while idle")
    fired: dict[str, float] = {}
    deadline = time.monotonic() + 90
    while len(fired) < len(ALERTS) and time.monotonic() < deadline:
        for name in ALERTS:
            if name not in fired and _firing(prom, name):
                fired[name] = time.time() - t_leak
        time.sleep(0.5)
    alerts = prom.alerts()
    assert len(fired) == len(ALERTS), (fired, alerts, prom.log_tail())
    for a in alerts:
        assert a["labels"].get("replica") == replica(faulty), a  # nothing pending or firing for the clean one
    errors = [a["labels"] for a in alerts if a["labels"]["alertname"] == "KVGuardianErrorFinding"]
    assert ("KVG204", "kvguardian-audit") in {(e["id"], e["job"]) for e in errors}, errors  # the lost frees
    idle = next(a for a in alerts if a["labels"]["alertname"] == "VLLMKVUsageWhileIdle")
    assert idle["labels"]["instance"] == replica(faulty) and idle["labels"]["model_name"] == "tiny"
    for name, seconds in fired.items():
        pending = next(a for a in alerts if a["labels"]["alertname"] == name)["activeAt"]
        since = datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", pending.replace("Z", "+00:00")))
        print(f"leak -> {name} firing for replica {replica(faulty)}: {seconds:.1f} s (pending from "
              f"{since.timestamp() - t_leak:+.1f} s; rules' durations / {SCALE}, 1 s scrape and evaluation"
              + ("; the faulty replica already held leaked KV before this test)" if leaked_before else ")"))
    # the watcher speaks for both replicas: each series names its replica and model
    batches = prom.query("kvguardian_watch_kv_event_batches_total")
    assert {(s["metric"]["replica"], s["metric"]["model_name"]) for s in batches} == {
        (replica(clean), "tiny"), (replica(faulty), "tiny")}
    kvg207 = 'kvguardian_findings{job="kvguardian-watch",id="KVG207"} > 0'  # the watcher's black-box finding
    assert wait_until(lambda: [s["metric"]["replica"] for s in prom.query(kvg207)] == [replica(faulty)],
                      timeout=20), prom.query(kvg207)


def test_the_dashboard_queries_return_data_from_it(fleet):
    """Every ``expr`` of the generated dashboard, run as Grafana would (``$__rate_interval`` -> 30 s). An expr
    whose metrics this fleet exports must return data; the others are listed with what they need."""
    prom = fleet
    present = set(prom.api("label/__name__/values"))
    rows, missing_data = [], []
    for expr in dashboard_exprs():
        query = expr.replace("$__rate_interval", RATE_INTERVAL)
        names = set(re.findall(r"\b((?:kvguardian|vllm|sglang)[a-z0-9_:]*)", query)) - {"kvguardian"}
        absent = sorted(names - present)
        result = prom.query(query)
        if absent:
            why = f"no source in this fleet for {', '.join(absent)}"
        elif result:
            why = f"{len(result)} series"
        elif re.search(r"\[(\d+)([mh])\]", query) and re.search(r"[<>=]=?\s*\d", query):
            why = "empty: a floor over a window longer than this Prometheus has run (it includes pre-leak samples)"
        else:
            why = "EMPTY although its metrics are scraped"
            missing_data.append(expr)
        rows.append(f"  {'data ' if result else 'none '} {expr[:110]}  -> {why}")
    print("\ndashboard queries against the fleet:\n" + "\n".join(rows))
    assert not missing_data, missing_data
    assert sum(1 for r in rows if r.startswith("  data")) >= 10

