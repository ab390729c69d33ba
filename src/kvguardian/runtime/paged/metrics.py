"""Metrics of a paged pool: blocks by state, residency and fragmentation ratios, prefix hit rate, evictions.

The residency ratio (KV bytes whose owner has ended / all KV bytes) and the fragmentation ratio (bytes
allocated but holding no token / bytes allocated) are the ledger's (docs/design/ledger.md), read for a
preallocated pool. Prefix queries and hits count prompt tokens, as vLLM's counters do. How each term maps to
blocks: docs/design/paged.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvguardian.runtime.paged.audit import table_references

if TYPE_CHECKING:  # pragma: no cover
    from kvguardian.runtime.paged.view import PoolView

__all__ = ["METRIC_KEYS", "pool_metrics"]

#: Keys every `pool_metrics` result has (the observability exporter relies on the first ten).
METRIC_KEYS = (
    "blocks_total", "blocks_free", "blocks_cached", "blocks_referenced", "residency_ratio",
    "fragmentation_ratio", "prefix_queries_total", "prefix_hits_total", "prefix_hit_rate", "evictions_total",
    "residency_leaked_ratio", "usage_ratio", "block_size", "block_bytes", "blocks_orphaned", "requests_open",
    "requests_lost_free", "preemptions_total", "cow_copies_total", "blocks_allocated_total",
    "block_frees_total", "faults_total", "events_dropped_total",
)


def pool_metrics(pool: PoolView) -> dict[str, float | int]:
    bp = pool.blocks
    n = pool.num_blocks
    bs = pool.block_size
    ref = bp.ref
    referenced = ref > 0
    unreferenced = ~referenced
    n_ref = int(referenced.sum())
    n_cached = int((unreferenced & bp.cached).sum())
    n_free = n - n_ref - n_cached
    tables = pool.tables()
    _, _, live_refs = table_references(tables, n)
    n_orphaned = int((referenced & (live_refs == 0)).sum())  # referenced, yet no live table lists it
    allocated = referenced | bp.cached
    n_alloc = int(allocated.sum())
    empty_slots = int((bs - np.minimum(pool.filled[allocated], bs)).sum())
    queries, hits = pool.prefix_queries, pool.prefix_hits
    return {
        "blocks_total": n,
        "blocks_free": n_free,
        "blocks_cached": n_cached,
        "blocks_referenced": n_ref,
        "residency_ratio": (n_cached + n_orphaned) / n,
        "fragmentation_ratio": empty_slots / (n_alloc * bs) if n_alloc else 0.0,
        "prefix_queries_total": queries,
        "prefix_hits_total": hits,
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "evictions_total": bp.evictions,
        "residency_leaked_ratio": n_orphaned / n,
        "usage_ratio": n_ref / n,  # vLLM's kv_cache_usage_perc: cached-unreferenced blocks count as free
        "block_size": bs,
        "block_bytes": pool.block_bytes,
        "blocks_orphaned": n_orphaned,
        "requests_open": len(tables),
        "requests_lost_free": len(pool.closed_tables()) + pool.closed_forgotten,
        "preemptions_total": pool.preemptions,
        "cow_copies_total": pool.cow_copies,
        "blocks_allocated_total": bp.allocated,
        "block_frees_total": bp.freed,
        "faults_total": sum(pool.faults_count.values()),
        "events_dropped_total": pool.events.dropped,
    }
