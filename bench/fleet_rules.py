"""What kv-guardian's rules cost a real Prometheus over a fleet: rule-group evaluation time by fleet size.

    PYTHONPATH=src .venv/bin/python bench/fleet_rules.py [--replicas 40,160] [--hours 4.25] [--step 60]

For each fleet size N: N replicas' worth of the series the rules read, as one vLLM replica's exporters give
them (the oom-guard sidecar's memory and guard series, the watch's findings, vLLM's three gauges) plus the
ledger's KV series, with the target labels a PodMonitor/ServiceMonitor adds (instance, pod, namespace, model:
four replicas per model), one replica in ten leaking orphaned KV; samples every ``--step`` seconds over the
last ``--hours`` hours (the growth rules look 4 hours back), written as OpenMetrics and backfilled with
``promtool tsdb create-blocks-from openmetrics``. Debian's ``prometheus`` then starts on 127.0.0.1 over those
blocks with ``deploy/prometheus/kvguardian-rules.yml`` (evaluation every 5 s), and after ``--evaluations``
evaluations the bench reads, per rule group, ``prometheus_rule_group_last_duration_seconds`` at every
evaluation (median and max) and how many series each recording rule returned (``/api/v1/query``).

Range functions cost in proportion to the samples in their window: at a 15 s scrape interval a window holds
``step / 15`` times the samples it holds here (4x at the default 60 s); the JSON says how many. Wall-clock on a
shared machine: read the ratios between sizes, not the absolute times. Writes bench/results/fleet_rules.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RULES = HERE.parent / "deploy" / "prometheus" / "kvguardian-rules.yml"
REPLICAS_PER_MODEL = 4


def _series(replica: int) -> list[tuple[str, dict[str, str], str]]:
    """(name, labels, shape) of one replica's series the rules read; shape: how its value moves."""
    from kvguardian.core.findings import CATALOG

    leak = replica % 10 == 0
    out: list[tuple[str, dict[str, str], str]] = [
        ("kvguardian_kv_bytes", {"state": "live"}, "saw"),
        ("kvguardian_kv_bytes", {"state": "retained"}, "saw"),
        ("kvguardian_kv_bytes", {"state": "orphaned"}, "rise" if leak else "zero"),
        # what the rule kvguardian:kv_ended_bytes recorded over the hours before (the growth rules read its past)
        ("kvguardian:kv_ended_bytes", {}, "rise" if leak else "saw"),
        ("kvguardian_kv_residency_ratio", {}, "ratio"),
        ("kvguardian_kv_fragmentation_ratio", {}, "ratio"),
        ("kvguardian_memory_pressure_ratio", {"signal": "cgroup"}, "ratio"),
        ("kvguardian_memory_used_bytes", {"signal": "cgroup"}, "saw"),
        ("kvguardian_memory_limit_bytes", {"signal": "cgroup"}, "limit"),
        ("kvguardian_memory_signal_up", {"signal": "cgroup"}, "one"),
        ("kvguardian_memory_oom_kills_total", {"signal": "cgroup"}, "zero"),
        ("kvguardian_oom_draining", {}, "zero"),
        ("kvguardian_oom_shed_requests_total", {}, "zero"),
        ("vllm:kv_cache_usage_perc", {"engine": "0"}, "ratio"),
        ("vllm:num_requests_running", {"engine": "0"}, "saw"),
        ("vllm:num_requests_waiting", {"engine": "0"}, "zero"),
    ]
    out += [("kvguardian_oom_watermark_ratio", {"action": a}, "watermark") for a in ("evict", "drain", "shed")]
    out += [("kvguardian_findings", {"id": k.id, "name": k.name, "severity": k.severity.value}, "zero")
            for k in CATALOG.values()]
    return out


def _value(shape: str, i: int) -> float:
    """The ``i``-th sample of a series of ``shape``."""
    return {"saw": float((i % 20) * 1_000_000), "rise": float(i * 100_000), "zero": 0.0, "one": 1.0,
            "limit": 4e9, "watermark": 0.92, "ratio": (i % 20) / 40}[shape]


def write_openmetrics(path: Path, replicas: int, hours: float, step: int, end: int) -> tuple[int, int]:
    """The fleet's samples, one series after another (OpenMetrics, ``# EOF`` last); returns (series, samples)."""
    times = list(range(end - int(hours * 3600), end + 1, step))
    series = 0
    with path.open("w") as f:
        by_name: dict[str, list[tuple[dict[str, str], str]]] = {}
        for r in range(replicas):
            target = {"namespace": "llm", "pod": f"kv-inference-{r:05d}", "instance": f"10.0.{r // 250}.{r % 250}:8081",
                      "model": f"model-{r // REPLICAS_PER_MODEL:04d}"}
            for name, labels, shape in _series(r):
                by_name.setdefault(name, []).append(({**labels, **target}, shape))
        for name, rows in by_name.items():
            f.write(f"# TYPE {name} gauge\n")
            for labels, shape in rows:
                series += 1
                text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                f.writelines(f"{name}{{{text}}} {_value(shape, i)} {t}\n" for i, t in enumerate(times))
        f.write("# EOF\n")
    return series, series * len(times)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return str(resp.read().decode())


def _group_durations(metrics: str) -> dict[str, tuple[float, float]]:
    """rule group -> (last duration s, iterations) from Prometheus's own /metrics."""
    last: dict[str, float] = {}
    iters: dict[str, float] = {}
    for line in metrics.splitlines():
        for prefix, into in (("prometheus_rule_group_last_duration_seconds{", last),
                             ("prometheus_rule_group_iterations_total{", iters)):
            if line.startswith(prefix):
                group = line.split('rule_group="', 1)[1].split('"', 1)[0].rsplit(";", 1)[-1]
                into[group] = float(line.rsplit(" ", 1)[1])
    return {g: (last[g], iters.get(g, 0.0)) for g in last}


def measure(replicas: int, hours: float, step: int, evaluations: int, promtool: str, prometheus: str
            ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        om = work / "fleet.om"
        t0 = time.monotonic()
        series, samples = write_openmetrics(om, replicas, hours, step, int(time.time()) - 30)
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(work / "data")],
                       check=True, capture_output=True)
        om.unlink()
        backfill_s = time.monotonic() - t0
        (work / "prometheus.yml").write_text(json.dumps({
            "global": {"evaluation_interval": "5s"}, "rule_files": [str(RULES)]}))
        port = _free_port()
        proc = subprocess.Popen([prometheus, f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--storage.tsdb.retention.time=2d"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            seen: dict[str, dict[float, float]] = {}
            deadline = time.monotonic() + 60 + 10 * evaluations
            while time.monotonic() < deadline:
                try:
                    groups = _group_durations(_get(f"{base}/metrics"))
                except OSError:
                    groups = {}
                for g, (last, it) in groups.items():
                    if it >= 1:
                        seen.setdefault(g, {})[it] = last
                if seen and all(len(v) >= evaluations for v in seen.values()):
                    break
                time.sleep(0.5)
            results = {}
            for rule in _records():
                q = urllib.parse.urlencode({"query": f"count({rule})"})
                data = json.loads(_get(f"{base}/api/v1/query?{q}"))["data"]["result"]
                results[rule] = int(float(data[0]["value"][1])) if data else 0
            firing = json.loads(_get(f"{base}/api/v1/alerts"))["data"]["alerts"]
        finally:
            proc.terminate()
            proc.wait(30)
    return {
        "replicas": replicas, "series": series, "samples": samples, "step_s": step, "backfill_s": round(backfill_s, 1),
        "groups": {g: {"evaluations": len(v), "median_ms": round(1000 * statistics.median(v.values()), 2),
                       "max_ms": round(1000 * max(v.values()), 2)} for g, v in seen.items()},
        "recorded_series": results,
        "alerts": sorted({(a["labels"]["alertname"], a["state"]) for a in firing}),
        "alerting_pods": len({a["labels"].get("pod") for a in firing}),
        "loadavg_1m": round(os.getloadavg()[0], 1),
    }


def _records() -> list[str]:
    import yaml

    return [r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", default="40,160", help="fleet sizes, comma-separated (default 40,160)")
    p.add_argument("--hours", type=float, default=4.25)
    p.add_argument("--step", type=int, default=60, help="seconds between samples (default 60)")
    p.add_argument("--evaluations", type=int, default=6)
    p.add_argument("-o", "--output", type=Path, default=HERE / "results" / "fleet_rules.json")
    args = p.parse_args(argv)
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    if promtool is None or prometheus is None:
        print("fleet_rules: promtool and prometheus are needed; fix: apt-get install prometheus", file=sys.stderr)
        return 3
    runs = [measure(int(n), args.hours, args.step, args.evaluations, promtool, prometheus)
            for n in args.replicas.split(",")]
    from results_io import write_json

    write_json(args.output, {"hours": args.hours, "scrape_interval_equivalent": f"{args.step}s", "runs": runs})
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
