"""The Prometheus collector: fresh metric families from the ledger, attached pools and the latest findings.

`collect()` reads `Ledger.totals()`, each attached pool's ``metrics()`` and the last published report; it never
runs detectors or a GC pass, so a scrape costs the same at a million entries as at none
(``bench/exporter_scrape.py``). A source that raises is skipped and counted, never propagated (fail-open).
Example: docs/design/exporters.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvguardian.core.errors import UsageError
from kvguardian.core.exporters.catalog import by_name
from kvguardian.core.faults import SITES
from kvguardian.core.findings import CATALOG, Finding, Report
from kvguardian.core.ledger import Ledger
from kvguardian.core.report.escape import visible

__all__ = [
    "POOL_METRIC_KEYS",
    "KVGuardianCollector",
    "PoolMetrics",
    "ScrapeCollector",
    "by_label",
    "family",
    "findings_families",
    "merged",
    "one_sample",
    "with_labels",
]

log = logging.getLogger("kvguardian")

#: Keys a paged pool's ``metrics()`` must return (the contract with ``kvguardian.runtime.paged``).
POOL_METRIC_KEYS = (
    "blocks_total", "blocks_free", "blocks_cached", "blocks_referenced", "residency_ratio", "fragmentation_ratio",
    "prefix_queries_total", "prefix_hits_total", "prefix_hit_rate", "evictions_total",
)


@runtime_checkable
class PoolMetrics(Protocol):
    """A paged block pool as the exporter sees it: one call returning its counters (see `POOL_METRIC_KEYS`)."""

    def metrics(self) -> Mapping[str, float | int]: ...


class _SafeLabels:
    """Label values may come from outside (a Redis key pattern, a server's label): control and bidi
    characters are written as visible escapes (``\\x1b``), so the exposition stays one sample per line,
    safe to print, and readable by every parser; prometheus_client then escapes ``\\``, ``"`` and newlines
    as the text format requires."""

    def add_metric(self, labels: Sequence[str], *args: Any, **kwargs: Any) -> None:
        super().add_metric([visible(v) for v in labels], *args, **kwargs)  # type: ignore[misc]


class _Gauge(_SafeLabels, GaugeMetricFamily):
    pass


class _Counter(_SafeLabels, CounterMetricFamily):
    pass


def family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    """An empty metric family for catalog entry ``name`` (HELP text and labels from the catalog); label values
    added to it are made safe (`_SafeLabels`)."""
    spec = by_name(name)
    cls = _Counter if spec.kind == "counter" else _Gauge
    return cls(spec.family_name, spec.help, labels=list(spec.labels))


def one_sample(name: str, value: float, labels: Sequence[str] = ()) -> Metric:
    """Catalog family ``name`` holding one sample."""
    fam = family(name)
    fam.add_metric(list(labels), float(value))
    return fam


def by_label(name: str, items: Iterable[tuple[Any, float]]) -> Metric:
    """Catalog family ``name`` with one sample per ``(label value, value)`` pair, in label order."""
    fam = family(name)
    for label, value in sorted(items):
        fam.add_metric([str(label)], float(value))
    return fam


def findings_families(findings: Sequence[Finding], checked_at: float | None) -> Iterator[Metric]:
    """``kvguardian_findings`` (every catalog id, 0 when absent) and the time of the check they come from.

    One series per id, whatever the findings' severities: its ``severity`` label is the catalog's for the id,
    so a finding reported at another severity (a suspected KVG105, a proven KVG208) neither adds a second
    series nor replaces the id's series with a new one (which would reset an alert's ``for:``). The value
    counts the id's findings of every severity; each finding's own severity is in the report.
    """
    fam = family("kvguardian_findings")
    counts = Counter(f.id for f in findings)
    for kind in CATALOG.values():
        fam.add_metric([kind.id, kind.name, kind.severity.value], float(counts.get(kind.id, 0)))
    yield fam
    ts = family("kvguardian_last_check_timestamp_seconds")
    ts.add_metric([], float(checked_at or 0.0))
    yield ts


def with_labels(metrics: Iterable[Metric], labels: Mapping[str, str]) -> Iterator[Metric]:
    """The families with ``labels`` added to every sample (values made safe, as `family` does): how one
    exporter speaking for several targets (a fleet watch) names the target of each series."""
    extra = {k: visible(v) for k, v in labels.items()}
    for m in metrics:
        out = Metric(m.name, m.documentation, m.type, m.unit)
        out.samples = [s._replace(labels={**extra, **s.labels}) for s in m.samples]
        yield out


def merged(metrics: Iterable[Metric]) -> list[Metric]:
    """Families of the same name joined into one (first seen first): an exposition names each family once."""
    by_name: dict[str, Metric] = {}
    for m in metrics:
        if m.name in by_name:
            by_name[m.name].samples.extend(m.samples)
        else:
            by_name[m.name] = out = Metric(m.name, m.documentation, m.type, m.unit)
            out.samples = list(m.samples)
    return list(by_name.values())


class ScrapeCollector(Collector):
    """A collector whose families are read at scrape time only: `describe` names none, so registering one (even
    on prometheus_client's auto-describing default registry) reads no source and checks no duplicate names."""

    def describe(self) -> Iterator[Metric]:
        return iter(())


class KVGuardianCollector(ScrapeCollector):
    """Yields fresh families at every scrape from the injected sources; never mutates them.

    Args:
        ledger: the ledger to read (``guard.ledger``); None exports no ``kvguardian_kv_*`` families.
        pools: name -> pool honouring `PoolMetrics`; more can be attached later.
        findings: a callable returning ``(findings, unix time of their check)``; the default reads what
            `publish` stored.
    """

    def __init__(
        self,
        ledger: Ledger | None = None,
        *,
        pools: Mapping[str, PoolMetrics] | None = None,
        findings: Callable[[], tuple[Sequence[Finding], float | None]] | None = None,
    ) -> None:
        self._ledger = ledger
        self._pools: dict[str, PoolMetrics] = {}
        self._lock = threading.Lock()
        self._findings: tuple[Finding, ...] = ()
        self._checked_at: float | None = None
        self._findings_fn = findings
        self._source_errors: Counter[str] = Counter()
        self._logged: set[str] = set()
        for name, pool in (pools or {}).items():
            self.attach_pool(name, pool)

    def __repr__(self) -> str:
        return f"<KVGuardianCollector ledger={self._ledger is not None} pools={sorted(self._pools)}>"

    # ------------------------------------------------------------------ configuration
    def attach_pool(self, name: str, pool: PoolMetrics) -> None:
        """Export ``pool``'s blocks by state and prefix counters under label ``pool=name``.

        Raises:
            UsageError: ``pool`` has no ``metrics()`` method, or ``name`` is empty or already attached.
        """
        if not isinstance(pool, PoolMetrics):
            raise UsageError(
                f"pool {name!r} ({type(pool).__name__}) has no metrics() method; fix: attach an object whose "
                f"metrics() returns {', '.join(POOL_METRIC_KEYS)}"
            )
        if not name or name in self._pools:
            raise UsageError(f"pool name {name!r} is empty or already attached; fix: give each pool a unique name")
        with self._lock:
            self._pools[name] = pool

    def detach_pool(self, name: str) -> None:
        with self._lock:
            self._pools.pop(name, None)

    def publish(self, findings: Report | Iterable[Finding], checked_at: float | None = None) -> None:
        """Export these findings (a `Report` or a list) until the next publish."""
        items = tuple(findings.findings if isinstance(findings, Report) else findings)
        when = checked_at if checked_at is not None else (
            findings.created if isinstance(findings, Report) else time.time()
        )
        with self._lock:
            self._findings, self._checked_at = items, when

    # ------------------------------------------------------------------ prometheus_client
    def collect(self) -> Iterator[Metric]:
        out: list[Metric] = []
        if self._ledger is not None:
            self._guarded("ledger", out, self._ledger_families)
        with self._lock:
            pools = list(self._pools.items())
        if pools:
            self._guarded("pool", out, lambda: self._pool_families(pools))
        self._guarded("findings", out, self._findings_families)
        errors = family("kvguardian_exporter_source_errors_total")
        for source in ("ledger", "pool", "findings"):
            errors.add_metric([source], float(self._source_errors[source]))
        out.append(errors)
        return iter(out)

    def note_source_error(self, source: str, exc: BaseException, *, traceback: bool = True) -> None:
        """Count a failure to read ``source`` (exported as a counter); log the first one per source (with its
        traceback unless ``traceback=False``, for expected failures such as a half-written report file)."""
        self._source_errors[source] += 1
        if source not in self._logged:
            self._logged.add(source)
            log.warning("kv-guardian exporter: reading %s failed (%s); skipped, further errors only counted",
                        source, exc, exc_info=exc if traceback else None)

    def _guarded(self, source: str, out: list[Metric], build: Callable[[], list[Metric]]) -> None:
        try:
            out.extend(build())
        except Exception as exc:  # a broken source must not break the scrape (fail-open)
            self.note_source_error(source, exc)

    def _ledger_families(self) -> list[Metric]:
        assert self._ledger is not None
        t = self._ledger.totals()
        kv_bytes, entries = family("kvguardian_kv_bytes"), family("kvguardian_kv_entries")
        for state, n in t.bytes_by_state.items():
            kv_bytes.add_metric([state], float(n))
            entries.add_metric([state], float(t.entries_by_state[state]))
        events = family("kvguardian_kv_lifecycle_events_total")
        for kind, n in t.event_counts.items():
            events.add_metric([kind], float(n))
        errors = family("kvguardian_guard_instrumentation_errors_total")
        for site in sorted(set(SITES) | set(t.instrumentation_errors)):
            errors.add_metric([site], float(t.instrumentation_errors.get(site, 0)))
        return [
            kv_bytes,
            entries,
            one_sample("kvguardian_kv_residency_ratio", t.residency_ratio),
            one_sample("kvguardian_kv_fragmentation_ratio", t.fragmentation_ratio),
            one_sample("kvguardian_kv_released_bytes_total", t.released_bytes),
            one_sample("kvguardian_kv_released_entries_total", t.released_entries),
            events,
            one_sample("kvguardian_requests_active", t.requests_active),
            one_sample("kvguardian_model_generation", t.generation),
            errors,
            one_sample("kvguardian_guard_events_dropped_total", t.events_dropped),
        ]

    def _pool_families(self, pools: list[tuple[str, PoolMetrics]]) -> list[Metric]:
        blocks = family("kvguardian_pool_blocks")
        fams = {
            key: family(name)
            for key, name in (
                ("blocks_total", "kvguardian_pool_capacity_blocks"),
                ("residency_ratio", "kvguardian_pool_residency_ratio"),
                ("fragmentation_ratio", "kvguardian_pool_fragmentation_ratio"),
                ("prefix_queries_total", "kvguardian_pool_prefix_queries_total"),
                ("prefix_hits_total", "kvguardian_pool_prefix_hits_total"),
                ("prefix_hit_rate", "kvguardian_pool_prefix_hit_ratio"),
                ("evictions_total", "kvguardian_pool_evictions_total"),
            )
        }
        for name, pool in pools:
            m = pool.metrics()
            missing = [k for k in POOL_METRIC_KEYS if k not in m]
            if missing:
                raise UsageError(f"pool {name!r}: metrics() lacks {missing}; fix: return every key of POOL_METRIC_KEYS")
            for state in ("free", "cached", "referenced"):
                blocks.add_metric([name, state], float(m[f"blocks_{state}"]))
            for key, fam in fams.items():
                fam.add_metric([name], float(m[key]))
        return [blocks, *fams.values()]

    def _findings_families(self) -> list[Metric]:
        if self._findings_fn is not None:
            findings, checked_at = self._findings_fn()
        else:
            with self._lock:
                findings, checked_at = self._findings, self._checked_at
        return list(findings_families(findings, checked_at))
