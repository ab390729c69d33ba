"""deploy/grafana: the committed dashboard is what the script generates, and --check refuses panels that query
metrics nobody exports or expressions promtool cannot parse."""

import importlib.util
import json
import subprocess
import sys

import pytest

from kvg_testing import ROOT, require_binary

SCRIPT = ROOT / "deploy" / "grafana" / "generate_dashboard.py"
COMMITTED = ROOT / "deploy" / "grafana" / "kvguardian-dashboard.json"


def load():
    spec = importlib.util.spec_from_file_location("generate_dashboard", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_check_passes_on_the_committed_dashboard():
    require_binary("promtool")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "is current" in proc.stdout


def test_dashboard_shape():
    dash = json.loads(COMMITTED.read_text())
    assert dash["templating"]["list"][0] == {**dash["templating"]["list"][0], "name": "datasource",
                                             "type": "datasource", "query": "prometheus"}
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for needed in ("kvguardian_kv_residency_ratio", "kvguardian_kv_fragmentation_ratio",
                   'kvguardian_kv_bytes{state="orphaned"}', "kvguardian_findings", "vllm:prefix_cache_hits_total",
                   "max_over_time(vllm:num_requests_running[10m]) == 0", "kvguardian_redis_pattern_no_ttl_bytes"):
        assert needed in exprs
    for p in panels:  # no overlap in the grid
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24


@pytest.fixture
def gen(tmp_path):
    module = load()
    out = tmp_path / "dash.json"
    return module, out


def check_with_extra_panel(gen, panel_title, expr):
    """Generate the dashboard with one more panel (written out, so only that panel can be wrong); check it."""
    module, out = gen
    module.ROWS.append(("Broken", [module.Panel(panel_title, [module.Q(expr)])]))
    try:
        dash = module.build()
        out.write_text(module.render(dash))
        return module.check(dash, out, require_binary("promtool"))
    finally:
        module.ROWS.pop()


def test_a_panel_on_a_metric_nobody_exports_fails_the_check(gen):
    assert check_with_extra_panel(gen, "typo", "kvguardian_kv_bytez") == [
        "panel 'typo' queries kvguardian_kv_bytez, which nobody exports (not in the kv-guardian metric catalog, "
        "the vLLM/SGLang metrics the watchers read, or a recording rule)"]


def test_an_expression_promtool_cannot_parse_fails_the_check(gen):
    problems = check_with_extra_panel(gen, "syntax", "sum by (instance (kvguardian_kv_bytes)")
    assert len(problems) == 1 and problems[0].startswith("panel 'syntax': promtool cannot parse")


def test_a_stale_committed_file_fails_the_check(gen):
    module, out = gen
    out.write_text(COMMITTED.read_text().replace("kv-guardian: KV-cache", "edited by hand: KV-cache"))
    problems = module.check(module.build(), out, require_binary("promtool"))
    assert problems == [f"{out.name} is not current; fix: run python generate_dashboard.py and commit it"]


def test_fleet_panels_read_the_fleet_recording_rules_by_model_and_by_replica():
    import yaml

    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "kvguardian-rules.yml").read_text())
    fleet = {r["record"] for g in rules["groups"] if g["name"] == "kvguardian-fleet" for r in g["rules"]}
    dash = json.loads(COMMITTED.read_text())
    row = next(i for i, p in enumerate(dash["panels"]) if p["type"] == "row" and p["title"].startswith("Fleet"))
    panels = []
    for p in dash["panels"][row + 1:]:
        if p["type"] == "row":
            break
        panels.append(p)
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = {name for name in fleet if any(name in e for e in exprs)}
    assert used == fleet  # every fleet view has a panel
    assert any("by (model" in e for e in exprs)
    replica = [t for p in panels for t in p["targets"] if "instance:" in t["expr"]]
    assert replica and all("{{instance}} {{pod}}" in t["legendFormat"] for t in replica)  # names the replica
