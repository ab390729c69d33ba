"""The watch's metrics: active findings (``kvguardian_findings``) and the ``kvguardian_watch_*`` families.

Families come from `kvguardian.core.exporters.catalog`; label values are closed sets (event types, decode reasons,
anomaly kinds, media capped by the audit), never hashes, salts or request ids. A fleet watch (`FleetCollector`)
exports every replica's families with ``replica`` (its metrics host:port) and ``model_name`` first on each
series: one series set per replica, never per request.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from kvguardian.core.exporters.prometheus import (
    ScrapeCollector,
    by_label,
    family,
    findings_families,
    merged,
    one_sample,
    with_labels,
)
from kvguardian.runtime.engines.fleet import Fleet
from kvguardian.runtime.engines.kv_events import REASONS
from kvguardian.runtime.engines.prefix_audit import ANOMALIES
from kvguardian.runtime.engines.watch import Watch

__all__ = ["FleetCollector", "WatchCollector"]

_EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


class WatchCollector(ScrapeCollector):
    """Reads a `Watch` at every scrape (the watch loop runs in another thread; reads are of plain counters)."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    def collect(self) -> Iterator[Metric]:
        w = self.watch
        yield from findings_families(w.board.active(), w.last_scrape_time)
        yield one_sample("kvguardian_watch_scrapes_total", w.scrapes, [w.engine])
        yield one_sample("kvguardian_watch_scrape_errors_total", sum(list(w.scrape_errors.values())), [w.engine])
        if w.vllm is not None:
            yield one_sample("kvguardian_watch_idle_kv_seconds", w.idle_seconds(), [w.engine])
        if w.sglang is not None:
            yield one_sample("kvguardian_watch_sglang_unaccounted_tokens", w.sglang.max_unaccounted())
        audit, sub = w.audit, w.subscriber
        if audit is None or sub is None:
            return
        ev = family("kvguardian_watch_kv_events_total")
        for t in _EVENT_TYPES:
            ev.add_metric([t], float(audit.events.get(t, 0)))
        ev.add_metric(["unknown"], float(sub.errors.get("unknown_type", 0)))
        err = family("kvguardian_watch_kv_event_errors_total")
        for reason in REASONS:
            err.add_metric([reason], float(sub.errors.get(reason, 0)))
        anomalies = family("kvguardian_watch_kv_event_anomalies_total")
        for kind in ANOMALIES:
            anomalies.add_metric([kind], float(audit.anomalies.get(kind, 0)))
        yield from (ev, err, anomalies)
        yield by_label("kvguardian_watch_prefix_index_blocks", audit.size_by_medium().items())
        for name, value in (
            ("kvguardian_watch_kv_event_batches_total", sub.batches),
            ("kvguardian_watch_kv_event_gaps_total", sub.gaps),
            ("kvguardian_watch_kv_event_batches_replayed_total", sub.replayed),
            ("kvguardian_watch_kv_event_batches_lost_total", sub.lost),
            ("kvguardian_watch_prefix_namespaces", audit.namespaces()),
            ("kvguardian_watch_prefix_clears_total", audit.clears),
        ):
            yield one_sample(name, value)


class FleetCollector(ScrapeCollector):
    """Reads every replica's `Watch` of a `Fleet` at each scrape; each series names its replica and model."""

    def __init__(self, fleet: Fleet) -> None:
        self.collectors = [WatchCollector(w) for w in fleet.watches]

    def collect(self) -> Iterator[Metric]:
        yield from merged(
            m for c in self.collectors
            for m in with_labels(c.collect(), {"replica": c.watch.replica, "model_name": c.watch.model_name}))
