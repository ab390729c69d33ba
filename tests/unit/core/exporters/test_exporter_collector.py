"""KVGuardianCollector: fresh families from the ledger, pools and findings; catalog names only; fail-open."""

import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvg_testing import require_binary
from kvguardian.core.errors import UsageError
from kvguardian.core.exporters.catalog import by_name, names
from kvguardian.core.exporters.prometheus import POOL_METRIC_KEYS, KVGuardianCollector
from kvguardian.core.findings import CATALOG, Finding, Report, Severity
from kvguardian.core.ledger import Ledger


class Pool:
    """A paged pool as issue 4's pool exposes it (duck-typed PoolMetrics)."""

    def __init__(self, **override):
        self.values = dict(blocks_total=10, blocks_free=5, blocks_cached=2, blocks_referenced=3, residency_ratio=0.25,
                           fragmentation_ratio=0.125, prefix_queries_total=8, prefix_hits_total=6,
                           prefix_hit_rate=0.75, evictions_total=1, **override)

    def metrics(self):
        return dict(self.values)


def scrape(collector):
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def ledger_with_entries():
    led = Ledger()
    a, b = led.begin_request("a"), led.begin_request("b")
    led.add_entry(1, kind="block", nbytes=1000, request=a, source="t", filled_tokens=4, capacity_tokens=16)
    led.add_entry(2, kind="block", nbytes=3000, request=b, source="t")
    led.add_entry(3, kind="block", nbytes=500, request=b, source="t")
    led.end_request("b")
    led.retain_keys([3], "prefix cache")
    return led


def test_ledger_families_match_the_snapshot_definitions():
    led = ledger_with_entries()
    _, s = scrape(KVGuardianCollector(led))
    snap = led.snapshot()
    assert s[("kvguardian_kv_bytes", (("state", "live"),))] == 1000
    assert s[("kvguardian_kv_bytes", (("state", "orphaned"),))] == 3000
    assert s[("kvguardian_kv_bytes", (("state", "retained"),))] == 500
    assert s[("kvguardian_kv_entries", (("state", "orphaned"),))] == 1
    assert s[("kvguardian_kv_residency_ratio", ())] == pytest.approx(snap.residency_ratio()) == 3500 / 4500
    assert s[("kvguardian_kv_fragmentation_ratio", ())] == pytest.approx(snap.fragmentation_ratio()) == 750 / 4500
    assert s[("kvguardian_requests_active", ())] == 1
    assert s[("kvguardian_kv_lifecycle_events_total", (("kind", "init"),))] == 3
    assert s[("kvguardian_guard_events_dropped_total", ())] == 0
    assert s[("kvguardian_guard_instrumentation_errors_total", (("site", "cache.update"),))] == 0


def test_ledger_totals_agree_with_snapshot_after_releases_and_hits():
    led = ledger_with_entries()
    c = led.begin_request("c")
    led.touch_entry(2, c)  # a hit: the orphaned entry is live again under request c
    led.release_entry(1)
    t, snap = led.totals(), led.snapshot()
    assert t.bytes_by_state == snap.bytes_by_state()
    assert t.residency_ratio == pytest.approx(snap.residency_ratio())
    assert t.fragmentation_ratio == pytest.approx(snap.fragmentation_ratio())
    assert (t.released_entries, t.released_bytes) == (1, 1000)


def test_pool_families_and_the_protocol_contract():
    _, s = scrape(KVGuardianCollector(pools={"main": Pool()}))
    assert s[("kvguardian_pool_blocks", (("pool", "main"), ("state", "cached")))] == 2
    assert s[("kvguardian_pool_capacity_blocks", (("pool", "main"),))] == 10
    assert s[("kvguardian_pool_prefix_hits_total", (("pool", "main"),))] == 6
    assert s[("kvguardian_pool_prefix_hit_ratio", (("pool", "main"),))] == 0.75
    with pytest.raises(UsageError, match="has no metrics\\(\\) method"):
        KVGuardianCollector().attach_pool("x", object())
    col = KVGuardianCollector(pools={"main": Pool()})
    with pytest.raises(UsageError, match="already attached"):
        col.attach_pool("main", Pool())
    assert set(POOL_METRIC_KEYS) == set(Pool().metrics())


def test_findings_by_id_and_severity_every_id_present():
    col = KVGuardianCollector()
    col.publish(Report([Finding("KVG102", Severity.ERROR, "x"), Finding("KVG102", Severity.ERROR, "y"),
                        Finding("KVG103", Severity.INFO, "bounded")]), checked_at=1234.5)
    _, s = scrape(col)
    assert s[("kvguardian_findings", (("id", "KVG102"), ("name", "orphaned-kv"), ("severity", "error")))] == 2
    # one series per id: an info-severity KVG103 counts under the catalog's severity (warning)
    assert s[("kvguardian_findings", (("id", "KVG103"), ("name", "kv-growth"), ("severity", "warning")))] == 1
    assert s[("kvguardian_findings", (("id", "KVG301"), ("name", "cold-no-ttl-keys"), ("severity", "error")))] == 0
    ids = [k[1][0][1] for k in s if k[0] == "kvguardian_findings"]
    assert sorted(ids) == sorted(CATALOG)  # every id exactly once
    assert s[("kvguardian_last_check_timestamp_seconds", ())] == 1234.5


def test_one_series_per_id_whatever_the_severities():
    col = KVGuardianCollector()
    col.publish([Finding("KVG208", Severity.ERROR, "proven"), Finding("KVG208", Severity.WARNING, "salts"),
                 Finding("KVG105", Severity.WARNING, "suspected")])
    _, s = scrape(col)
    series = {k: v for k, v in s.items() if k[0] == "kvguardian_findings"}
    kvg208 = [(k, v) for k, v in series.items() if k[1][0] == ("id", "KVG208")]
    kvg105 = [(k, v) for k, v in series.items() if k[1][0] == ("id", "KVG105")]
    assert [v for _, v in kvg208] == [2] and dict(kvg208[0][0][1])["severity"] == "warning"
    assert [v for _, v in kvg105] == [1] and dict(kvg105[0][0][1])["severity"] == "error"
    col.publish([])
    _, after = scrape(col)
    assert {k for k in after if k[0] == "kvguardian_findings"} == set(series)  # same series, now 0


def test_only_catalog_metrics_with_catalog_help_are_exported():
    led = ledger_with_entries()
    col = KVGuardianCollector(led, pools={"main": Pool()})
    col.publish([Finding("KVG207", Severity.WARNING, "idle")])
    text, _ = scrape(col)
    fams = list(text_string_to_metric_families(text))
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in fams}
    assert exported == set(names("guard")) | set(names("pool"))
    for f in fams:
        spec = by_name(f.name + ("_total" if f.type == "counter" else ""))
        assert f.documentation == spec.help and f.type == spec.kind


def test_a_failing_source_is_skipped_and_counted_not_raised():
    class Broken:
        def metrics(self):
            raise RuntimeError("pool is gone")

    led = ledger_with_entries()
    col = KVGuardianCollector(led, pools={"bad": Broken()})
    _, s = scrape(col)
    _, s = scrape(col)
    assert s[("kvguardian_exporter_source_errors_total", (("source", "pool"),))] == 2
    assert s[("kvguardian_kv_bytes", (("state", "live"),))] == 1000  # the rest of the scrape still answers
    assert not any(k[0] == "kvguardian_pool_blocks" for k in s)


def test_a_pool_missing_keys_is_counted_with_its_name(caplog):
    col = KVGuardianCollector(pools={"half": Pool()})
    del col._pools["half"].values["evictions_total"]
    _, s = scrape(col)
    assert s[("kvguardian_exporter_source_errors_total", (("source", "pool"),))] == 1
    assert "lacks ['evictions_total']" in caplog.text


def test_exposition_passes_promtool_lint():
    promtool = require_binary("promtool")
    led = ledger_with_entries()
    col = KVGuardianCollector(led, pools={"main": Pool()})
    col.publish([Finding("KVG102", Severity.ERROR, "x")])
    text, _ = scrape(col)
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), proc.stdout + proc.stderr


def test_the_real_paged_pool_through_the_collector():
    """Issue 4's pool and issue 7's collector agree on the contract (no duck-typed stand-in)."""
    from kvguardian.runtime.paged import KVSpec, PagedKVPool

    pool = PagedKVPool(num_blocks=32, block_size=4, kv=KVSpec(num_layers=1, kv_heads=1, head_dim=4))
    pool.open("r-1", tenant="acme")
    pool.append("r-1", list(range(10)))  # 3 blocks, the last one half full
    pool.free("r-1")  # full blocks stay cached for the prefix cache
    pool.open("r-2", tenant="acme")
    hit = pool.match_prefix("r-2", list(range(10)))
    pool.append("r-2", list(range(hit, 10)))
    m = pool.metrics()
    _, s = scrape(KVGuardianCollector(pools={"main": pool}))
    for state in ("free", "cached", "referenced"):
        assert s[("kvguardian_pool_blocks", (("pool", "main"), ("state", state)))] == m[f"blocks_{state}"]
    assert s[("kvguardian_pool_capacity_blocks", (("pool", "main"),))] == 32
    assert s[("kvguardian_pool_prefix_hits_total", (("pool", "main"),))] == m["prefix_hits_total"] == hit > 0
    assert m["blocks_free"] + m["blocks_cached"] + m["blocks_referenced"] == 32
