"""Prometheus families of an `OOMGuard` (owner ``oom`` in `kvguardian.core.exporters.catalog`).

    registry.register(OOMCollector(oom))       # or mount it beside the guard's exporter

Reading the guard is a copy of counters it keeps: a scrape never samples the signals itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from kvguardian.core.exporters.prometheus import ScrapeCollector, by_label, one_sample

if TYPE_CHECKING:
    from kvguardian.ops.oom.guard import OOMGuard

__all__ = ["OOMCollector"]


class OOMCollector(ScrapeCollector):
    def __init__(self, oom: OOMGuard) -> None:
        self.oom = oom

    def collect(self) -> Iterator[Metric]:
        g = self.oom
        readings = list(g.readings)
        ratio = [(r.signal, r.ratio) for r in readings if r.ratio is not None]
        used = [(r.signal, r.used) for r in readings if r.used is not None and r.unit == "bytes"]
        limit = [(r.signal, r.limit) for r in readings if r.limit is not None and r.unit == "bytes"]
        kills = [(r.signal, r.extra["oom_kill"]) for r in readings if "oom_kill" in r.extra]
        names = {s.name for s in g.signals} | {r.signal for r in readings}
        up = [(r.signal, 1.0 if r.ok else 0.0) for r in readings]
        wm = g.watermarks
        yield by_label("kvguardian_memory_pressure_ratio", ratio)
        yield by_label("kvguardian_memory_used_bytes", used)
        yield by_label("kvguardian_memory_limit_bytes", limit)
        yield by_label("kvguardian_memory_signal_up", up)
        yield by_label("kvguardian_memory_signal_errors_total", [(n, g.signal_errors.get(n, 0)) for n in names])
        yield by_label("kvguardian_memory_oom_kills_total", kills)
        yield by_label("kvguardian_oom_watermark_ratio", [("evict", wm.evict), ("drain", wm.drain), ("shed", wm.shed)])
        yield one_sample("kvguardian_oom_draining", 1.0 if (g.state.draining or g.shutdown) else 0.0)
        yield one_sample("kvguardian_oom_ready", 1.0 if g.ready else 0.0)
        yield one_sample("kvguardian_oom_in_flight_requests", g.in_flight)
        yield by_label("kvguardian_oom_evictions_total", dict(g.evictions).items())
        yield by_label("kvguardian_oom_evicted_bytes_total", dict(g.evicted_bytes).items())
        yield one_sample("kvguardian_oom_rejected_admissions_total", g.rejected)
        yield one_sample("kvguardian_oom_shed_requests_total", g.shed_requests)
        yield by_label("kvguardian_oom_samples_total", dict(g.samples).items())
        yield by_label("kvguardian_oom_guard_errors_total", dict(g.errors).items())
