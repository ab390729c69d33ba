#!/usr/bin/env python3
"""Generate kv-guardian's Grafana dashboard (``kvguardian-dashboard.json`` next to this script).

    python deploy/grafana/generate_dashboard.py           # write the JSON
    python deploy/grafana/generate_dashboard.py --check   # exit 1 when the committed JSON is stale, a panel
                                                          # queries a metric nobody exports, or promtool
                                                          # cannot parse an expression

"Exported" is read from the code: kv-guardian's metric catalog (``kvguardian.core.exporters.catalog``), the vLLM
and SGLang metrics its watchers read (``kvguardian.runtime.engines.*_metrics.METRICS_READ``) and the recording rules
in ``deploy/prometheus/*.yml``. The test suite runs ``--check`` (tests/integration/core/exporters/test_grafana_dashboard.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "kvguardian-dashboard.json"
RULE_FILES = sorted((HERE.parent / "prometheus").glob("*.yml"))
DS = {"type": "prometheus", "uid": "${datasource}"}


@dataclass
class Q:
    expr: str
    legend: str = "{{instance}}"


@dataclass
class Panel:
    title: str
    queries: list[Q]
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"  # or "stat"
    thresholds: list[tuple[float, str]] = field(default_factory=list)  # (value, color) above which it turns color
    stack: bool = False
    width: int = 12


def with_floor(expr: str, window: str, label: str) -> list[Q]:
    """A series and its floor over ``window`` (the value its alert compares), the floor labelled 'LABEL floor'."""
    return [Q(expr), Q(f"min_over_time({expr}[{window}])", f"{{{{instance}}}} {label} floor")]


ROWS: list[tuple[str, list[Panel]]] = [
    ("Ledger: residency and fragmentation (the article, §4.3)", [
        Panel("KV residency ratio", with_floor("kvguardian_kv_residency_ratio", "30m", "30 min"),
              unit="percentunit", thresholds=[(0.65, "red")],
              description="KV bytes whose owner request ended / all KV bytes (docs/design/ledger.md). The alert uses the "
                          "30-minute floor above the article's 0.65 and requires orphaned bytes too."),
        Panel("KV fragmentation ratio", with_floor("kvguardian_kv_fragmentation_ratio", "1h", "1 h"),
              unit="percentunit", thresholds=[(0.3, "orange")],
              description="KV bytes holding no token / allocated KV bytes. The alert uses the 1-hour floor above the "
                          "article's 0.3."),
        Panel("KV bytes by state", [
            Q("sum by (instance, state) (kvguardian_kv_bytes)", "{{instance}} {{state}}"),
        ], unit="bytes", stack=True,
            description="live: owner request active; retained: owner ended, retention declared; orphaned: owner "
                        "ended, nothing declared it (a leak)."),
        Panel("Orphaned KV bytes", with_floor('kvguardian_kv_bytes{state="orphaned"}', "15m", "15 min"),
              unit="bytes", thresholds=[(1, "red")],
              description="A 15-minute floor above 0 is KVG102: KV alive after its request ended."),
        Panel("Ended-owner KV bytes and their floor", with_floor("kvguardian:kv_ended_bytes", "1h", "1 h"),
              unit="bytes", width=24,
              description="Retained + orphaned bytes. A sawtooth with a level floor is healthy; a rising floor is "
                          "growth (KVGuardianKVGrowth)."),
    ]),
    ("Fleet: by model and by replica (recording rules of group kvguardian-fleet)", [
        Panel("KV bytes by model and state", [
            Q("sum by (model, state) (model:kvguardian_kv_bytes:sum)", "{{model}} {{state}}"),
        ], unit="bytes", stack=True,
            description="Every replica's KV summed per model (model:kvguardian_kv_bytes:sum). The model label is a "
                        "target label (docs/notes/fleet.md)."),
        Panel("KV bytes: the 10 largest replicas", [
            Q('topk(10, sum without (state) (instance:kvguardian_kv_bytes:sum))', "{{instance}} {{pod}} {{model}}"),
        ], unit="bytes", description="All KV a replica tracks (live, retained, orphaned)."),
        Panel("Orphaned KV bytes by model", [
            Q("sum by (model) (model:kvguardian_kv_orphaned_bytes:sum)", "{{model}}"),
        ], unit="bytes", thresholds=[(1, "red")],
            description="KV alive after its request ended, summed over each model's replicas (KVG102)."),
        Panel("Orphaned KV bytes: the 10 worst replicas", [
            Q("topk(10, instance:kvguardian_kv_orphaned_bytes:sum)", "{{instance}} {{pod}} {{model}}"),
        ], unit="bytes", thresholds=[(1, "red")],
            description="Per replica (instance, pod): the one that leaks stands out; KVGuardianOrphanedKV names it."),
        Panel("KV floor growth over 3 h: the 10 worst replicas", [
            Q("topk(10, instance:kvguardian_kv_ended_bytes:floor_growth3h)", "{{instance}} {{pod}} {{model}}"),
            Q("sum by (model) (model:kvguardian_kv_ended_bytes:floor_growth3h)", "{{model}} (all replicas)"),
        ], unit="bytes", thresholds=[(64 * 1024 * 1024, "orange")],
            description="How far the 1-hour floor of ended-owner KV rose in 3 hours; KVGuardianKVGrowth fires above "
                        "64 MiB."),
        Panel("Pre-OOM headroom: the 10 replicas closest to OOM", [
            Q("bottomk(10, instance:kvguardian_memory_headroom_ratio:min)", "{{instance}} {{pod}} {{model}}"),
        ], unit="percentunit",
            description="1 - the worst memory signal's used/limit (cgroup, GPU, pool, KV budget) per replica."),
        Panel("Pre-OOM headroom by model (its worst replica)", [
            Q("min by (model) (model:kvguardian_memory_headroom_ratio:min)", "{{model}}"),
        ], unit="percentunit", description="The smallest headroom among each model's replicas, as a share of the limit."),
        Panel("Pre-OOM headroom bytes, by model and the 10 lowest replicas", [
            Q("min by (model) (model:kvguardian_memory_headroom_bytes:min)", "{{model}} (its worst replica)"),
            Q("bottomk(10, instance:kvguardian_memory_headroom_bytes:min)", "{{instance}} {{pod}} {{model}}"),
        ], unit="bytes", width=24, description="The fewest bytes left before a limit: per model, and the 10 replicas "
                                               "with the fewest."),
    ]),
    ("Findings", [
        Panel("Findings by id and severity", [
            Q("sum by (id, name, severity) (kvguardian_findings) > 0", "{{id}} {{name}} ({{severity}})"),
        ], stack=True, description="Findings of the latest check (runtime, pool, watchers, Redis), by finding id."),
        Panel("Seconds since the findings were checked", [
            Q("time() - (kvguardian_last_check_timestamp_seconds > 0)"),
        ], unit="s", kind="stat", thresholds=[(600, "orange")]),
    ]),
    ("Paged block pool", [
        Panel("Pool blocks by state", [
            Q("sum by (pool, state) (kvguardian_pool_blocks)", "{{pool}} {{state}}"),
            Q("sum by (pool) (kvguardian_pool_capacity_blocks)", "{{pool}} capacity"),
        ], stack=False, description="free + cached + referenced must equal the capacity (KVG206)."),
        Panel("Pool prefix hit rate and evictions", [
            Q("sum by (pool) (rate(kvguardian_pool_prefix_hits_total[$__rate_interval])) / "
              "sum by (pool) (rate(kvguardian_pool_prefix_queries_total[$__rate_interval]))", "{{pool}} hit rate"),
            Q("sum by (pool) (rate(kvguardian_pool_evictions_total[$__rate_interval]))", "{{pool}} evictions/s"),
        ], unit="short"),
    ]),
    ("vLLM", [
        Panel("vLLM KV cache usage", [
            Q("vllm:kv_cache_usage_perc", "{{instance}} engine {{engine}}"),
        ], unit="percentunit",
            description="A 0-1 ratio despite the name. Cached-unreferenced prefix blocks count as free."),
        Panel("vLLM requests running and waiting", [
            Q("vllm:num_requests_running", "{{instance}} engine {{engine}} running"),
            Q("vllm:num_requests_waiting", "{{instance}} engine {{engine}} waiting"),
        ]),
        Panel("vLLM KV usage while idle (KVG207)", [
            Q("min_over_time(vllm:kv_cache_usage_perc[10m]) > 0 "
              "and max_over_time(vllm:num_requests_running[10m]) == 0 "
              "and max_over_time(vllm:num_requests_waiting[10m]) == 0", "{{instance}} engine {{engine}}"),
        ], unit="percentunit", thresholds=[(0.0001, "red")],
            description="KV usage that never dropped to 0 over 10 minutes without running or waiting requests: "
                        "blocks a request never freed. Empty is healthy."),
        Panel("vLLM prefix cache hit rate", [
            Q("sum by (instance, model_name) (rate(vllm:prefix_cache_hits_total[$__rate_interval])) / "
              "sum by (instance, model_name) (rate(vllm:prefix_cache_queries_total[$__rate_interval]))",
              "{{instance}} {{model_name}}"),
        ], unit="percentunit", description="Tokens served from the prefix cache / tokens queried."),
        Panel("vLLM KV events (kv-guardian watch)", [
            Q("sum by (instance, type) (rate(kvguardian_watch_kv_events_total[$__rate_interval]))",
              "{{instance}} {{type}}/s"),
            Q("sum by (instance) (increase(kvguardian_watch_kv_event_batches_lost_total[$__rate_interval]))",
              "{{instance}} batches lost (KVG209)"),
            Q("sum by (instance) (increase(kvguardian_watch_kv_event_batches_replayed_total[$__rate_interval]))",
              "{{instance}} batches replayed"),
        ], description="Only prefix-cache membership is published: allocation and free are silent."),
        Panel("vLLM prefix index rebuilt from events", [
            Q("sum by (instance, medium) (kvguardian_watch_prefix_index_blocks)", "{{instance}} {{medium}} blocks"),
            Q("kvguardian_watch_prefix_namespaces", "{{instance}} cache-salt namespaces"),
        ], description="More GPU blocks than the pool holds means removals were never published (KVG208)."),
    ]),
    ("SGLang", [
        Panel("SGLang KV token pool", [
            Q("sglang:kv_available_tokens", "{{instance}} available"),
            Q("sglang:kv_evictable_tokens", "{{instance}} evictable"),
            Q("sglang:kv_used_tokens", "{{instance}} used"),
            Q("kvguardian:sglang_kv_unaccounted_tokens", "{{instance}} unaccounted"),
            Q("sglang:max_total_num_tokens", "{{instance}} total"),
        ], description="available + evictable + used + protected/session-held = total (KVG206)."),
        Panel("SGLang tokens unaccounted while idle", [
            Q("kvguardian:sglang_kv_unaccounted_tokens and sglang:num_running_reqs == 0 "
              "and sglang:num_queue_reqs == 0", "{{instance}} (Prometheus)"),
            Q("kvguardian_watch_sglang_unaccounted_tokens", "{{instance}} (kv-guardian watch)"),
        ], thresholds=[(1, "red")], description="With nothing running, no token may be held: a leak."),
    ]),
    ("Redis key space", [
        Panel("Redis keys and keys without TTL", [
            Q("kvguardian_redis_keys", "{{instance}} keys"),
            Q("kvguardian_redis_keys_without_ttl", "{{instance}} without TTL"),
            Q("min_over_time(kvguardian_redis_keys_without_ttl[1h])", "{{instance}} without TTL, 1 h floor"),
        ]),
        Panel("Top key patterns by no-TTL bytes", [
            Q("topk(10, kvguardian_redis_pattern_no_ttl_bytes)", "{{pattern}}"),
        ], unit="bytes"),
        Panel("Top key patterns by keys", [
            Q("topk(10, kvguardian_redis_pattern_keys)", "{{pattern}}"),
        ]),
        Panel("Top key patterns by bytes", [
            Q("topk(10, kvguardian_redis_pattern_bytes)", "{{pattern}}"),
        ], unit="bytes"),
        Panel("Key-space sweep", [
            Q("kvguardian_redis_sweep_duration_seconds", "{{instance}} duration"),
            Q("time() - kvguardian_redis_sweep_timestamp_seconds", "{{instance}} age"),
        ], unit="s", width=24),
    ]),
    ("kv-guardian health", [
        Panel("Instrumentation errors contained (fail-open)", [
            Q("sum by (instance, site) (increase(kvguardian_guard_instrumentation_errors_total[$__rate_interval]))",
              "{{instance}} {{site}}"),
        ], description="Errors inside kv-guardian's hooks, counted instead of reaching the model (KVG100)."),
        Panel("Events dropped and source errors", [
            Q("sum by (instance) (increase(kvguardian_guard_events_dropped_total[$__rate_interval]))",
              "{{instance}} events dropped"),
            Q("sum by (instance, source) (increase(kvguardian_exporter_source_errors_total[$__rate_interval]))",
              "{{instance}} {{source}} read errors"),
            Q("sum by (instance, engine) (increase(kvguardian_watch_scrape_errors_total[$__rate_interval]))",
              "{{instance}} {{engine}} scrape errors"),
        ]),
    ]),
]


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": value} for value, color in p.thresholds]
    custom: dict[str, Any] = {"lineWidth": 1, "fillOpacity": 10}
    if p.stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    if p.thresholds and p.kind == "timeseries":
        custom["thresholdsStyle"] = {"mode": "line"}
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": p.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": p.unit, "thresholds": {"mode": "absolute", "steps": steps},
                         **({"custom": custom} if p.kind == "timeseries" else {})},
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}} if p.kind == "timeseries" else
                   {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "none"},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": q.expr, "legendFormat": q.legend,
                     "range": True} for i, q in enumerate(p.queries)],
    }


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, row in ROWS:
        panels.append({"id": pid, "type": "row", "title": title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y, x = pid + 1, y + 1, 0
        for p in row:
            if x + p.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(p, pid, x, y))
            pid, x = pid + 1, x + p.width
        y += 8
    return {
        "uid": "kvguardian",
        "title": "kv-guardian: KV-cache and key-space leaks",
        "description": "Generated by deploy/grafana/generate_dashboard.py; edit the script, not this file.",
        "tags": ["kv-guardian", "kv-cache", "redis"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "annotations": {"list": []},
        "templating": {"list": [{
            "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False, "options": [],
        }]},
        "panels": panels,
    }


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def _targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def exported_names(rule_files: Iterable[Path] = ()) -> dict[str, str]:
    """Every metric name some component exports, mapped to who exports it: kv-guardian's catalog, the vLLM and
    SGLang metrics the watchers read, and the recording rules of ``rule_files``."""
    from kvguardian.core.exporters.catalog import METRICS
    from kvguardian.core.exporters.promql import recording_rule_names
    from kvguardian.runtime.engines import sglang_metrics, vllm_metrics

    out = {m.name: f"kv-guardian ({m.owner})" for m in METRICS}
    out.update({n: "vLLM" for n in vllm_metrics.METRICS_READ})
    out.update({n: "SGLang" for n in sglang_metrics.METRICS_READ})
    out.update({n: "recording rule" for n in recording_rule_names(rule_files)})
    return out


def check(dashboard: dict[str, Any], committed: Path, promtool: str | None) -> list[str]:
    """Problems, one line each: a stale committed file, unknown metrics, expressions promtool refuses."""
    from kvguardian.core.exporters.promql import metric_names, substitute_grafana

    problems = []
    if not committed.exists() or committed.read_text() != render(dashboard):
        problems.append(f"{committed.name} is not current; fix: run python {Path(__file__).name} and commit it")
    if not any(v.get("type") == "datasource" for v in dashboard["templating"]["list"]):
        problems.append("the dashboard has no datasource template variable")
    exported = exported_names(RULE_FILES)
    exprs: list[tuple[str, str]] = []
    for title, raw in _targets(dashboard):
        try:
            expr = substitute_grafana(raw)
            names = metric_names(expr)
        except ValueError as exc:
            problems.append(f"panel {title!r}: {exc}")
            continue
        exprs.append((title, expr))
        for name in sorted(names - set(exported)):
            problems.append(f"panel {title!r} queries {name}, which nobody exports (not in the kv-guardian metric "
                            "catalog, the vLLM/SGLang metrics the watchers read, or a recording rule)")
    if promtool is None:
        problems.append("promtool is not installed, so expressions were not parsed; fix: apt-get install prometheus")
    else:
        problems += _promtool_parse(promtool, exprs)
    return problems


def _promtool_parse(promtool: str, exprs: list[tuple[str, str]]) -> list[str]:
    """Parse every expression with promtool as a recording rule: all at once, then one by one if that fails (so
    an error names its panel)."""

    def refused(batch: list[tuple[str, str]], tmp: str) -> str | None:
        path = Path(tmp) / "panels.yml"
        path.write_text(json.dumps({"groups": [{"name": "panels", "rules": [
            {"record": "kvguardian:dashboard_check", "expr": expr} for _, expr in batch]}]}))
        proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
        if proc.returncode == 0:
            return None
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        return detail[-1] if detail else "?"

    with tempfile.TemporaryDirectory() as tmp:
        if refused(exprs, tmp) is None:
            return []
        problems = []
        for title, expr in exprs:
            why = refused([(title, expr)], tmp)
            if why is not None:
                problems.append(f"panel {title!r}: promtool cannot parse {expr!r}: {why}")
        return problems or ["promtool refused the panels' expressions together but accepted each alone"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify instead of writing (exit 1 on a problem)")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"dashboard file (default {OUTPUT.name})")
    args = parser.parse_args(argv)
    dashboard = build()
    if not args.check:
        args.output.write_text(render(dashboard))
        print(f"wrote {args.output} ({sum(1 for p in dashboard['panels'] if p['type'] != 'row')} panels)")
        return 0
    problems = check(dashboard, args.output, shutil.which("promtool"))
    for line in problems:
        print(f"dashboard check: {line}", file=sys.stderr)
    if not problems:
        print(f"dashboard check: {args.output.name} is current; {len(_targets(dashboard))} queries use exported "
              "metrics and parse")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
