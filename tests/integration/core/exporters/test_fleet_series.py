"""Bounded cardinality, from real scrapes: every exporter a replica runs (guard, oom-guard sidecar, watch) and
the Redis exporter, served over HTTP on loopback and loaded with requests of distinct ids and tenants and keys
of many patterns, export the same series after twice the traffic, only labels of the catalog's LABEL_BOUNDS,
within their bounds, and never a request id, tenant or key name as a label value (bench/fleet_series.py counts
the same scrapes for docs/notes/scale.md)."""

import sys
from collections import defaultdict

import pytest

from kvg_testing import IN_CI, ROOT
from kvguardian.core.exporters.catalog import LABEL_BOUNDS, by_name

sys.path.insert(0, str(ROOT / "bench"))
import fleet_series

pytestmark = pytest.mark.services  # redis-server

TOP = 10  # the Redis exporter's pattern cap for this test: fewer than the patterns written, so it binds


@pytest.fixture(scope="module")
def measured():
    import shutil

    binary = shutil.which("redis-server")
    if binary is None and IN_CI:
        pytest.fail("redis-server is not installed; fix: apt-get install redis-server")
    return fleet_series.measure(200, 2000 if binary else 0, binary, top=TOP)


def test_series_do_not_grow_with_requests_tenants_or_keys(measured):
    assert set(measured["loaded"]) >= {"guard", "oom_guard", "watch"}
    for name, samples in measured["loaded_twice"].items():
        assert fleet_series.counts(samples) == fleet_series.counts(measured["loaded"][name]), name


def test_every_label_is_declared_and_within_its_bound(measured):
    values = defaultdict(set)
    for samples in measured["loaded_twice"].values():
        for sample, labels in samples:
            spec = by_name(sample)
            assert set(labels) == set(spec.labels), sample
            for label, value in labels.items():
                values[(sample, label)].add(value)
    for (sample, label), seen in values.items():  # a bound holds in each family
        assert label in LABEL_BOUNDS, f"label {label!r} has no bound in kvguardian.core.exporters.catalog.LABEL_BOUNDS"
        assert len(seen) <= LABEL_BOUNDS[label].values, (sample, label, sorted(seen))
    if "redis" in measured["loaded"]:  # the cap binds: the top patterns and {other}
        assert len(values[("kvguardian_redis_pattern_keys", "pattern")]) == TOP + 1


def test_no_request_id_tenant_or_key_name_becomes_a_label_value(measured):
    used = set(measured["used"])
    assert len(used) > 400
    for samples in measured["loaded_twice"].values():
        for sample, labels in samples:
            leaked = [v for v in labels.values() if v in used or fleet_series.MARK in v]
            assert not leaked, (sample, leaked)
