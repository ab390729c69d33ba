"""`with_labels` and `merged`: how one exporter speaking for several targets (a fleet watch) names each target
on its series and still writes every family once."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvguardian.core.exporters.prometheus import ScrapeCollector, merged, one_sample, with_labels


class _Static(ScrapeCollector):
    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


def _exposition(metrics) -> str:
    registry = CollectorRegistry()
    registry.register(_Static(metrics))
    return generate_latest(registry).decode()


def test_two_targets_share_one_family_each_sample_named_by_its_target():
    a = with_labels([one_sample("kvguardian_watch_scrapes_total", 3, ["vllm"])], {"replica": "10.0.0.1:8000"})
    b = with_labels([one_sample("kvguardian_watch_scrapes_total", 5, ["vllm"])], {"replica": "10.0.0.2:8000"})
    text = _exposition(merged([*a, *b]))
    assert text.count("# TYPE kvguardian_watch_scrapes_total counter") == 1
    (family,) = list(text_string_to_metric_families(text))
    got = {s.labels["replica"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert got == {"10.0.0.1:8000": 3.0, "10.0.0.2:8000": 5.0}


def test_a_label_value_from_outside_is_made_visible_not_written_raw():
    (m,) = with_labels([one_sample("kvguardian_watch_prefix_namespaces", 1)], {"model_name": "evil\x1b[31m\n"})
    text = _exposition([m])
    assert "\x1b" not in text and "\\x1b" in text
    assert len([x for x in text.splitlines() if x.startswith("kvguardian_watch_prefix_namespaces")]) == 1


def test_merging_keeps_the_originals_unchanged():
    first = one_sample("kvguardian_watch_prefix_namespaces", 1)
    (out,) = merged([first, one_sample("kvguardian_watch_prefix_namespaces", 2)])
    assert len(out.samples) == 2 and len(first.samples) == 1
