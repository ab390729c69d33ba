"""Prometheus metrics: per-pattern gauges of a completed scan (bounded labels) and the O(1) server gauges.

Label cardinality is bounded: the ``top`` patterns by bytes keep their own ``pattern`` label, the rest are
summed under ``{other}``. Names follow the project's rules: ``kvguardian_`` prefix, base units.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvguardian.core.exporters.prometheus import family
from kvguardian.keyspace.patterns import OVERFLOW
from kvguardian.keyspace.result import ScanResult

__all__ = ["ScanCollector", "exposition", "info_families", "scan_families"]

#: (result field, metric name); names, HELP texts and labels come from kvguardian.core.exporters.catalog.
_PATTERN_GAUGES = (
    ("keys", "kvguardian_redis_pattern_keys"),
    ("bytes", "kvguardian_redis_pattern_bytes"),
    ("no_ttl_keys", "kvguardian_redis_pattern_no_ttl_keys"),
    ("no_ttl_bytes", "kvguardian_redis_pattern_no_ttl_bytes"),
    ("cold_keys", "kvguardian_redis_pattern_cold_keys"),
    ("cold_bytes", "kvguardian_redis_pattern_cold_bytes"),
)


def _value(name: str, value: float) -> Any:
    fam = family(name)
    fam.add_metric([], float(value))
    return fam


def _bounded(result: ScanResult, top: int) -> list[dict[str, Any]]:
    """The ``top`` patterns by bytes, plus one ``{other}`` row summing the rest (and the overflow)."""
    keep = [p for p in result.patterns if not p.get("overflow")][:top]
    rest = [p for p in result.patterns if p not in keep]
    if rest:
        other: dict[str, Any] = {k: sum(int(p[k]) for p in rest) for k, _ in _PATTERN_GAUGES}
        other["pattern"] = OVERFLOW
        other["idle_s"] = {"p50": None, "p90": None,
                           "max": max((p.get("idle_s", {}).get("max") or 0 for p in rest), default=None)}
        keep = [*keep, other]
    return keep


def scan_families(result: ScanResult | None, *, top: int = 50, prefix_labels: dict[str, str] | None = None
                   ) -> Iterator[Any]:
    """Metric families of one scan (nothing when there is none yet)."""
    if result is None:
        return
    rows = _bounded(result, top)
    for field, name in _PATTERN_GAUGES:
        g = family(name)
        for p in rows:
            g.add_metric([p["pattern"]], float(p[field]))
        yield g
    if result.idle_metric == "idletime":
        g = family("kvguardian_redis_pattern_idle_seconds")
        for p in rows:
            for k in ("p50", "p90", "max"):
                v = (p.get("idle_s") or {}).get(k)
                if v is not None:
                    g.add_metric([p["pattern"], k], float(v))
        yield g
    for name, value in (
        ("kvguardian_redis_sweep_duration_seconds", result.duration_s),
        ("kvguardian_redis_sweep_timestamp_seconds", result.finished),
        ("kvguardian_redis_sweep_keys", result.keys_scanned),
        ("kvguardian_redis_sweep_patterns", len(result.patterns)),
        ("kvguardian_redis_sweep_complete", int(result.complete)),
    ):
        yield _value(name, value)
    g = family("kvguardian_redis_findings")
    counts: dict[tuple[str, str], int] = {}
    for f in result.findings:
        counts[(f.id, f.severity.value)] = counts.get((f.id, f.severity.value), 0) + 1
    for (fid, sev), n in sorted(counts.items()):
        g.add_metric([fid, sev], float(n))
    yield g


def info_families(info: dict[str, Any], up: bool, scrape_s: float) -> Iterator[Any]:
    """The O(1) gauges from one ``INFO keyspace`` + ``INFO memory`` (merged into ``info``)."""
    yield _value("kvguardian_redis_up", float(up))
    yield _value("kvguardian_redis_scrape_duration_seconds", scrape_s)
    if not up:
        return
    keys = family("kvguardian_redis_keys")
    expires = family("kvguardian_redis_keys_with_ttl")
    nottl = family("kvguardian_redis_keys_without_ttl")
    for db, v in sorted(info.items()):
        if db.startswith("db") and isinstance(v, dict):
            k, e = int(v.get("keys", 0)), int(v.get("expires", 0))
            keys.add_metric([db], float(k))
            expires.add_metric([db], float(e))
            nottl.add_metric([db], float(k - e))
    yield from (keys, expires, nottl)
    for field, name in (
        ("used_memory", "kvguardian_redis_used_memory_bytes"),
        ("used_memory_dataset", "kvguardian_redis_used_memory_dataset_bytes"),
        ("maxmemory", "kvguardian_redis_maxmemory_bytes"),
    ):
        if field in info:
            yield _value(name, info[field])


class ScanCollector:
    """A prometheus_client collector over one fixed scan result (``scan --prometheus``)."""

    def __init__(self, result: ScanResult, *, top: int = 50) -> None:
        self.result = result
        self.top = top

    def collect(self) -> Iterator[Any]:
        yield from scan_families(self.result, top=self.top)


def exposition(result: ScanResult, *, top: int = 50) -> str:
    """The Prometheus text exposition of one scan."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScanCollector(result, top=top))  # type: ignore[arg-type]
    return generate_latest(registry).decode()
