"""The metric catalog: naming conventions, the docs' metric table, and that collectors only yield catalog metrics."""

import re

import pytest

from kvguardian.core.exporters.catalog import FORBIDDEN_LABELS, METRICS, by_name, label_table, markdown_table, names


@pytest.mark.parametrize("spec", METRICS, ids=lambda m: m.name)
def test_names_follow_prometheus_conventions(spec):
    assert re.fullmatch(r"kvguardian_[a-z][a-z0-9_]*", spec.name)
    assert spec.kind in ("gauge", "counter")
    assert spec.name.endswith("_total") == (spec.kind == "counter"), "_total on counters only, and on every one"
    assert not set(spec.labels) & FORBIDDEN_LABELS
    assert spec.help and spec.help[0].isupper() and not spec.help.endswith(".")
    assert spec.owner in ("guard", "pool", "watch", "vllm", "oom", "redis")
    if "ratio" in spec.name.split("_"):
        assert spec.name.endswith("_ratio")
    for unit in ("bytes", "seconds"):
        if unit in spec.name.split("_"):
            assert spec.name.endswith(f"_{unit}") or spec.name.endswith(f"_{unit}_total"), "base unit last"


def test_names_are_unique_and_lookup_names_the_fix():
    assert len(names()) == len(set(names()))
    assert by_name("kvguardian_kv_bytes").labels == ("state",)
    with pytest.raises(KeyError, match="add it there first"):
        by_name("kvguardian_nope")


def test_redis_names_the_dashboard_and_rules_rely_on_are_exported():
    assert set(names("redis")) >= {
        "kvguardian_redis_keys", "kvguardian_redis_keys_without_ttl", "kvguardian_redis_pattern_keys",
        "kvguardian_redis_pattern_bytes", "kvguardian_redis_pattern_no_ttl_bytes",
        "kvguardian_redis_sweep_duration_seconds", "kvguardian_redis_sweep_timestamp_seconds",
    }


def test_docs_metric_table_is_generated_from_the_catalog():
    from kvg_testing import docs_reference

    page = docs_reference().metrics_page()  # reference/metrics.md of the documentation site
    assert markdown_table() in page and label_table() in page


# Bounded cardinality (issue 29): the catalog side; tests/integration/core/exporters/test_fleet_series.py checks the
# bounds on real scrapes under traffic.
PER_REQUEST = re.compile(r"request|^rid$|session|prompt|tenant|user|trace|span|hash|salt|uuid|^key|token|seq|addr|"
                         r"^ip$|path|url|^pid$")


@pytest.mark.parametrize("spec", METRICS, ids=lambda m: m.name)
def test_every_label_is_bounded_and_none_is_per_request(spec):
    from kvguardian.core.exporters.catalog import LABEL_BOUNDS

    for label in spec.labels:
        assert not PER_REQUEST.search(label), f"{spec.name}: {label!r} looks per-request, per-key or per-tenant"
        assert label in LABEL_BOUNDS, f"{spec.name}: label {label!r} has no bound in LABEL_BOUNDS"
        assert 0 < LABEL_BOUNDS[label].values <= 64


def test_the_fleet_labels_are_left_to_prometheus():
    """instance, pod, namespace, job, model and tenant are target labels: an exporter that set them would see
    them renamed exported_* by Prometheus (honor_labels: false) or override the target's (true)."""
    from kvguardian.core.exporters.catalog import LABEL_BOUNDS

    target = {"instance", "pod", "namespace", "job", "model", "tenant", "container", "node"}
    assert not target & set(LABEL_BOUNDS)
    assert not target & {label for m in METRICS for label in m.labels}
    assert not set(LABEL_BOUNDS) & FORBIDDEN_LABELS


def test_closed_label_sets_in_the_code_fit_their_stated_bounds():
    from kvguardian.core.exporters.catalog import LABEL_BOUNDS
    from kvguardian.core.faults import SITES
    from kvguardian.core.findings import CATALOG
    from kvguardian.core.ledger.events import EVENT_KINDS
    from kvguardian.runtime.engines.kv_events import REASONS
    from kvguardian.runtime.engines.prefix_audit import ANOMALIES

    bound = {label: b.values for label, b in LABEL_BOUNDS.items()}
    assert len(EVENT_KINDS) <= bound["kind"] and len(ANOMALIES) <= bound["kind"]
    assert len(SITES) < bound["site"]  # and the pre-OOM guard's few contained sites
    assert len(CATALOG) <= bound["id"] == bound["name"]
    assert len(REASONS) <= bound["reason"]
    unbounded = [label for label, b in LABEL_BOUNDS.items() if not b.source]
    assert not unbounded
