"""The metric catalog: naming conventions, the docs' metric table, and that collectors only yield catalog metrics."""

import re

import pytest

from kvguardian.core.exporters.catalog import FORBIDDEN_LABELS, METRICS, by_name, markdown_table, names


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

    assert markdown_table() in docs_reference().metrics_page()  # reference/metrics.md of the documentation site
