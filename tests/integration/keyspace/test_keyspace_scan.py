"""Scans of a real redis-server holding known patterns and leaks: patterns, stats, verdicts, outputs."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from kvg_redis import CONFIG_NAMES, SEED, keep_hot, require_binary

from kvguardian.keyspace.scan import ScanOptions, scan
from kvguardian.keyspace.verdicts import scan_findings

pytestmark = pytest.mark.services


def _by_pattern(result):
    return {p["pattern"]: p for p in result.patterns}


@pytest.mark.parametrize("mode", ["lua", "pipeline"])
def test_scan_finds_every_seeded_pattern_with_exact_counts(seeded, mode):
    with keep_hot(seeded.client()):
        result = scan(seeded.url, ScanOptions(mode=mode, cold_after=2, batch=150))
    assert result.complete and result.incomplete_reason is None
    assert result.mode == mode
    pats = _by_pattern(result)
    assert set(pats) == set(SEED)
    for name, (n, ttl, typ) in SEED.items():
        p = pats[name]
        assert p["keys"] == n, name
        assert p["types"] == {typ: n}, name
        assert p["no_ttl_keys"] == (n if ttl is None else 0), name
        assert p["bytes"] > 0 and p["bytes_max"] >= p["bytes_p50"] > 0
        if ttl is not None:
            bucket = "lt_1h" if ttl > 600 else "lt_10m"
            assert p["ttl"][bucket] == n, (name, p["ttl"])
    assert result.keys_scanned == sum(n for n, _, _ in SEED.values()) == result.dbsize
    # cold = no TTL and idle ≥ 2 s: everything without TTL except the config keys read just before
    assert pats["user:{int}:profile"]["cold_keys"] == 200
    assert pats["tmp_{ts_ns}"]["cold_keys"] == 150
    assert pats["config:{str}"]["cold_keys"] == 0
    assert pats["config:{str}"]["idle_s"]["max"] < pats["tmp_{ts_ns}"]["idle_s"]["p50"]
    assert pats["feed:{int}"]["collection_keys"] == 60
    top = pats["user:{int}:profile"]["top_keys"]
    assert len(top) == 5 and all(t["key"].startswith("user:") for t in top)
    assert top == sorted(top, key=lambda t: -t["bytes"])


def test_progress_reports_keys_against_dbsize(seeded):
    seen = []
    result = scan(seeded.url, ScanOptions(batch=100), progress=lambda done, total: seen.append((done, total)))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (result.keys_scanned, result.dbsize)
    from kvguardian.keyspace.render import progress_bar

    with progress_bar(True) as update:  # the rich bar itself (rendered to stderr)
        for done, total in seen:
            update(done, total)


def test_lua_and_pipeline_agree(seeded):
    a = scan(seeded.url, ScanOptions(mode="lua", cold_after=3600))
    b = scan(seeded.url, ScanOptions(mode="pipeline", cold_after=3600))
    fields = ("keys", "bytes", "no_ttl_keys", "no_ttl_bytes", "cold_keys", "types", "ttl")
    assert {p["pattern"]: [p[f] for f in fields] for p in a.patterns} == \
        {p["pattern"]: [p[f] for f in fields] for p in b.patterns}


def test_verdicts_name_pattern_counts_bytes_example_and_fix(seeded):
    with keep_hot(seeded.client()):
        result = scan(seeded.url, ScanOptions(cold_after=2))
    findings = scan_findings(result)
    by = {(f.id, f.evidence["pattern"]) for f in findings}
    assert ("KVG301", "user:{int}:profile") in by  # cold, no TTL
    assert ("KVG302", "tmp_{ts_ns}") in by  # timestamp in a no-TTL key name
    assert ("KVG305", "config:{str}") in by  # no TTL but hot: worth a look only
    assert not any(p in ("session:{uuid}", "cache:{hex}") for _, p in by)  # they have TTLs
    assert not any(i == "KVG301" and p == "config:{str}" for i, p in by)
    f302 = next(f for f in findings if f.id == "KVG302")
    assert f302.evidence["no_ttl_keys"] == 150 and f302.evidence["no_ttl_bytes"] > 0
    assert f302.evidence["example_key"].startswith("tmp_1712345678")
    assert "ts_ns" in f302.fix and "TTL" in f302.fix
    f301 = next(f for f in findings if f.id == "KVG301" and f.evidence["pattern"] == "user:{int}:profile")
    assert f301.evidence["cold_keys"] == 200 and "200 of 200" in f301.message


def test_sample_match_and_rate_limit(seeded):
    r = scan(seeded.url, ScanOptions(sample=100, batch=40))
    assert not r.complete and r.incomplete_reason == "sample" and r.keys_scanned == 100
    m = scan(seeded.url, ScanOptions(match="feed:*"))
    assert [p["pattern"] for p in m.patterns] == ["feed:{int}"] and m.keys_scanned == 60
    t0 = time.monotonic()
    slow = scan(seeded.url, ScanOptions(max_keys_per_sec=1500, batch=50))
    assert slow.complete
    assert time.monotonic() - t0 >= (slow.keys_scanned - 50) / 1500  # the limit is a floor on the duration


def test_cli_json_is_the_documented_schema_and_exit_code_follows_findings(seeded, kv_cli, tmp_path):
    out = tmp_path / "scan.json"
    with keep_hot(seeded.client()):
        rc, stdout, stderr = kv_cli("redis", "scan", seeded.url, "--json", "--cold-after", "2s", "-o", str(out))
    assert rc == 1, stderr  # KVG301/302 are errors
    data = json.loads(stdout)
    assert json.loads(out.read_text()) == data
    assert data["schema"] == "kv-guardian/redis-scan" and data["version"] == 1 and data["complete"] is True
    assert {f["id"] for f in data["findings"]} >= {"KVG301", "KVG302", "KVG305"}
    assert data["keys_scanned"] == data["dbsize"] and data["keys_per_s"] > 0
    rc, stdout, _ = kv_cli("redis", "scan", seeded.url, "--cold-after", "2s", "--fail-on", "never")
    assert rc == 0 and "tmp_{ts_ns}" in stdout and "KVG302" in stdout


def test_prometheus_exposition_passes_promtool(seeded, kv_cli, tmp_path):
    promtool = require_binary("promtool")
    prom = tmp_path / "scan.prom"
    rc, _, stderr = kv_cli("redis", "scan", seeded.url, "--prometheus", str(prom), "--fail-on", "never")
    assert rc == 0, stderr
    text = prom.read_text()
    assert 'kvguardian_redis_pattern_keys{pattern="session:{uuid}"} 300.0' in text
    assert "kvguardian_redis_sweep_duration_seconds" in text
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_redact_hides_every_literal_in_every_output(seeded, kv_cli, tmp_path):
    prom = tmp_path / "r.prom"
    rc, stdout, stderr = kv_cli("redis", "scan", seeded.url, "--json", "--redact", "--cold-after", "2s",
                                "--prometheus", str(prom))
    assert rc == 1, stderr
    data = json.loads(stdout)
    _, table, _ = kv_cli("redis", "scan", seeded.url, "--redact", "--cold-after", "2s")
    everything = stdout + prom.read_text() + table
    # the seeded names' prefixes, as they stand in a key (our own texts may use the words: "... cache entries")
    prefixes = [f"{p}{sep}" for p in ("session", "user", "profile", "tmp", "cache", "feed", "config") for sep in ":_"]
    for literal in (*prefixes, "1712345678", *CONFIG_NAMES):
        assert literal not in everything, literal
    pats = {p["pattern"] for p in data["patterns"]}
    assert any(p.endswith(":{uuid}") and p.startswith("~") for p in pats)
    assert data["redacted"] is True and {f["id"] for f in data["findings"]} >= {"KVG301", "KVG302"}
    again = json.loads(kv_cli("redis", "scan", seeded.url, "--json", "--redact")[1])
    assert {p["pattern"] for p in again["patterns"]} == pats  # stable hashes
