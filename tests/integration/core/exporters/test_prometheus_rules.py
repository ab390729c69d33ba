"""deploy/prometheus: promtool check rules is clean, every alert's promtool unit tests pass, and every alert is
tested firing, staying silent on a sawtooth that is not a leak, and resolving."""

import itertools
import re
import shutil
import subprocess

import pytest
import yaml

from kvg_testing import ROOT, require_binary

RULES = ROOT / "deploy" / "prometheus" / "kvguardian-rules.yml"
TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.test.yml"))
DOC = yaml.safe_load(RULES.read_text())
ALERTS = {r["alert"]: r for g in DOC["groups"] for r in g["rules"] if "alert" in r}
RECORDS = {r["record"]: r for g in DOC["groups"] for r in g["rules"] if "record" in r}


def test_promtool_check_rules_is_clean():
    proc = subprocess.run([require_binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS) + len(RECORDS)} rules found" in proc.stdout
    assert "warning" not in (proc.stdout + proc.stderr).lower()


@pytest.mark.parametrize("test_file", TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file):
    proc = subprocess.run([require_binary("promtool"), "test", "rules", str(test_file)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def expand(values: str) -> list[float]:
    """promtool's series notation: 'a', 'axn', 'a+bxn', 'a-bxn' (n + 1 values)."""
    out: list[float] = []
    for tok in values.split():
        m = re.fullmatch(r"(-?[\d.e+]+?)(?:([+-])([\d.e+]+))?x(\d+)", tok)
        if m is None:
            out.append(float(tok))
            continue
        start, sign, step, n = float(m[1]), m[2], float(m[3] or 0), int(m[4])
        step = -step if sign == "-" else step
        out.extend(start + i * step for i in range(n + 1))
    return out


def is_sawtooth(values: list[float]) -> bool:
    """Rises and falls back at least twice."""
    falls = sum(1 for a, b in itertools.pairwise(values) if b < a)
    rises = sum(1 for a, b in itertools.pairwise(values) if b > a)
    return falls >= 2 and rises >= 2


def _duration(text: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[u] for n, u in re.findall(r"(\d+)([smhd])", text))


def coverage(alert: str) -> dict[str, bool]:
    seen = {"fires": False, "resolves": False, "silent_on_sawtooth": False}
    for path in TESTS:
        for group in yaml.safe_load(path.read_text())["tests"]:
            evals = sorted((_duration(t["eval_time"]), bool(t["exp_alerts"]))
                           for t in group.get("alert_rule_test", []) if t["alertname"] == alert)
            if not evals:
                continue
            fired = [t for t, firing in evals if firing]
            seen["fires"] |= bool(fired)
            seen["resolves"] |= bool(fired) and any(t > fired[-1] and not f for t, f in evals)
            sawtooth = any(is_sawtooth(expand(s["values"])) for s in group["input_series"])
            seen["silent_on_sawtooth"] |= sawtooth and not fired and len(evals) >= 2
    return seen


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_every_alert_fires_resolves_and_stays_silent_on_a_sawtooth(alert):
    assert coverage(alert) == {"fires": True, "resolves": True, "silent_on_sawtooth": True}


def test_the_series_notation_expander():
    assert expand("0+2x3 7 5x1 10-1x2") == [0, 2, 4, 6, 7, 5, 5, 10, 9, 8]
    assert is_sawtooth([1, 2, 1, 2, 1]) and not is_sawtooth([1, 2, 3, 3, 4])


@pytest.mark.parametrize("name", sorted(ALERTS) + sorted(RECORDS))
def test_no_rate_or_increase_on_a_gauge(name):
    expr = (ALERTS.get(name) or RECORDS[name])["expr"]
    for fn, metric in re.findall(r"\b(rate|irate|increase)\(\s*([a-zA-Z_:][\w:]*)", expr):
        assert metric.endswith("_total"), f"{name}: {fn}() on {metric}, which is not a counter"
    assert ALERTS.get(name, {}).get("for") or name in RECORDS, "leak alerts hold for a while before they fire"


def test_a_naive_increase_on_the_gauge_fails_the_sawtooth_test(tmp_path):
    """The tests can fail: replace the growth alert by increase() on the gauge and its sawtooth test catches it."""
    promtool = require_binary("promtool")
    naive = RULES.read_text()
    start = naive.index("      - alert: KVGuardianKVGrowth\n        expr: |")
    end = naive.index("        for: 30m", start)
    naive = (naive[:start] + "      - alert: KVGuardianKVGrowth\n"
             "        expr: increase(kvguardian:kv_ended_bytes[3h]) > 64 * 1024 * 1024\n" + naive[end:])
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "kvguardian-rules.yml").write_text(naive)
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "deploy" / "prometheus" / "tests" / "KVGuardianKVGrowth.test.yml", tmp_path / "tests")
    test = tmp_path / "tests" / "KVGuardianKVGrowth.test.yml"
    rules = str(tmp_path / "rules" / "kvguardian-rules.yml")
    test.write_text(test.read_text().replace("../kvguardian-rules.yml", rules))
    proc = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "alertname: KVGuardianKVGrowth, time: 4h" in proc.stdout + proc.stderr  # the sawtooth group fired


def test_thresholds_from_the_article_are_kept_with_a_reason():
    text = RULES.read_text()
    assert "min_over_time(kvguardian_kv_residency_ratio[30m]) > 0.65" in text
    assert "min_over_time(kvguardian_kv_fragmentation_ratio[1h]) > 0.3" in text
    assert "The article's residency threshold, 0.65, kept" in text
    assert "The article's fragmentation threshold, 0.3, kept" in text


def test_every_kvguardian_metric_the_rules_read_is_in_the_exporter_catalog():
    from kvguardian.core.exporters.catalog import names

    exported = set(names())
    read = {m for r in (*ALERTS.values(), *RECORDS.values())
            for m in re.findall(r"(?<![\w:])kvguardian_\w+(?![\w:])", r["expr"])}  # not inside a rule's name
    assert read and read <= exported, sorted(read - exported)


def test_the_pre_oom_guards_state_has_alerts():
    """Issue 14: evicting, draining, shedding, budget use and OOM kills each alert, on the guard's own metrics."""
    wanted = {"KVGuardianEvictingContinuously": "kvguardian_oom_evictions_total",
              "KVGuardianDraining": "kvguardian_oom_draining",
              "KVGuardianSheddingRequests": "kvguardian_oom_shed_requests_total",
              "KVGuardianMemoryPressureHigh": "kvguardian_memory_pressure_ratio",
              "KVGuardianOOMKilled": "kvguardian_memory_oom_kills_total",
              "KVGuardianMemorySignalDown": "kvguardian_memory_signal_up"}
    for alert, metric in wanted.items():
        assert metric in ALERTS[alert]["expr"], alert


def test_a_pressure_alert_without_the_floor_fails_the_sawtooth_test(tmp_path):
    """The tests can fail: the raw pressure at the evict watermark (no floor) fires at a traffic peak where
    eviction holds the line, and the sawtooth test says so."""
    promtool = require_binary("promtool")
    raw = RULES.read_text().replace("min_over_time(kvguardian_memory_pressure_ratio[15m])",
                                    "kvguardian_memory_pressure_ratio")
    assert raw != RULES.read_text()
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "kvguardian-rules.yml").write_text(raw)
    (tmp_path / "tests").mkdir()
    name = "KVGuardianMemoryPressureHigh.test.yml"
    test = tmp_path / "tests" / name
    test.write_text((ROOT / "deploy" / "prometheus" / "tests" / name).read_text()
                    .replace("../kvguardian-rules.yml", str(tmp_path / "rules" / "kvguardian-rules.yml")))
    proc = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "alertname: KVGuardianMemoryPressureHigh, time: 39m" in proc.stdout + proc.stderr  # the sawtooth fired


# Fleet: the labels an operator groups by survive the rules (docs/notes/fleet.md).
REPLICA = {"namespace", "pod", "instance", "model", "engine", "tenant"}
FLEET_TEST = ROOT / "deploy" / "prometheus" / "tests" / "Fleet.test.yml"
FLEET = {r["record"]: r for g in DOC["groups"] if g["name"] == "kvguardian-fleet" for r in g["rules"]}


def grouping(expr: str) -> list[tuple[str, set[str]]]:
    """Every ``by (...)`` / ``without (...)`` clause of ``expr``: (keyword, labels)."""
    return [(kw, {x.strip() for x in labels.split(",") if x.strip()})
            for kw, labels in re.findall(r"\b(by|without)\s*\(([^)]*)\)", expr)]


@pytest.mark.parametrize("name", sorted(FLEET))
def test_fleet_rule_names_are_level_metric_operations_and_keep_the_replica(name):
    level, metric, *ops = name.split(":")
    assert ops and level in ("instance", "model") and re.fullmatch(r"kvguardian_[a-z0-9_]+", metric), name
    expr = FLEET[name]["expr"]
    if level == "instance":  # a replica view: every replica label kept, nothing else
        assert grouping(expr) and all(kw == "by" and labels - {"state"} == REPLICA for kw, labels in grouping(expr))
    elif level == "model":  # a fleet view: no replica label left
        assert grouping(expr) and all(kw == "by" and not labels & {"pod", "instance"} for kw, labels in grouping(expr))


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alerts_keep_and_name_the_replica(name):
    rule = ALERTS[name]
    for kw, labels in grouping(rule["expr"]):
        assert kw == "without" and not labels & REPLICA, f"{name} aggregates a replica label away"
    summary = rule["annotations"]["summary"]
    assert "{{ $labels.instance }}{{ with $labels.pod }} (pod {{ . }}){{ end }}" in summary


def test_the_fleet_views_cover_kv_orphans_growth_and_headroom_by_model_and_by_replica():
    for metric in ("kvguardian_kv_bytes", "kvguardian_kv_orphaned_bytes", "kvguardian_kv_ended_bytes",
                   "kvguardian_memory_headroom_ratio", "kvguardian_memory_headroom_bytes"):
        assert {r.split(":")[0] for r in FLEET if r.split(":")[1] == metric} == {"instance", "model"}, metric


def test_the_fleet_test_fails_when_an_alert_forgets_the_pod(tmp_path):
    """The multi-replica test can fail: an orphaned-KV alert summed over the replicas (a fleet-wide alert that
    cannot say which replica leaks) fails it."""
    promtool = require_binary("promtool")
    fleetwide = RULES.read_text().replace(
        'expr: min_over_time(kvguardian_kv_bytes{state="orphaned"}[15m]) > 0',
        'expr: sum by (model, state) (min_over_time(kvguardian_kv_bytes{state="orphaned"}[15m])) > 0')
    assert fleetwide != RULES.read_text()
    (tmp_path / "kvguardian-rules.yml").write_text(fleetwide)
    test = tmp_path / "tests" / FLEET_TEST.name
    test.parent.mkdir()
    test.write_text(FLEET_TEST.read_text())
    proc = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "alertname: KVGuardianOrphanedKV, time: 30m" in proc.stdout + proc.stderr
