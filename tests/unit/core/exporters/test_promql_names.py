"""Metric-name extraction used by the dashboard check."""

import pytest

from kvguardian.core.errors import UsageError
from kvguardian.core.exporters.promql import metric_names, substitute_grafana


@pytest.mark.parametrize(("expr", "expected"), [
    ('sum by (instance, state) (kvguardian_kv_bytes{state=~"retained|orphaned"})', {"kvguardian_kv_bytes"}),
    ("min_over_time(vllm:kv_cache_usage_perc[10m]) > 0 and max_over_time(vllm:num_requests_running[10m]) == 0",
     {"vllm:kv_cache_usage_perc", "vllm:num_requests_running"}),
    ("sum(rate(a_total[5m])) by (job) / on(job) group_left(extra) b offset 1h", {"a_total", "b"}),
    ("topk(10, kvguardian_redis_pattern_keys)", {"kvguardian_redis_pattern_keys"}),
    ('{__name__="foo", job="x"}', {"foo"}),
    ("time() - (x_seconds > 0)", {"x_seconds"}),
    ("x - (y or z * 0)", {"x", "y", "z"}),
    ("avg_over_time(q[1h:5m] @ end())", {"q"}),
    ('histogram_quantile(0.9, sum by (le) (rate(h_bucket[5m])))', {"h_bucket"}),
    ("sum without (state) (kvguardian:kv_ended_bytes) unless ignoring (a) c", {"kvguardian:kv_ended_bytes", "c"}),
])
def test_metric_names(expr, expected):
    assert metric_names(expr) == expected


def test_grafana_variables():
    assert substitute_grafana("rate(x[$__rate_interval])") == "rate(x[5m])"
    with pytest.raises(UsageError, match=r"template variable\(s\) \['\$instance'\]"):
        substitute_grafana('x{instance="$instance"}')
