"""The catalog of every metric kv-guardian exports: one place for names, types, labels and HELP text.

Collectors build their families from it (`kvguardian.core.exporters.prometheus.family` refuses other names), the
docs site's metrics reference is generated from it (``python -m kvguardian.core.exporters.catalog``) and the Grafana
dashboard's ``--check`` reads it. Names follow Prometheus conventions, and labels never carry request ids,
key names or tenants: every label has a stated bound (`LABEL_BOUNDS`). The labels a fleet groups by (instance,
pod, namespace, model, tenant) are target labels Prometheus adds when it scrapes, never exported here.
Naming rules and owners: docs/design/exporters.md; fleets: docs/notes/fleet.md.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FORBIDDEN_LABELS", "LABEL_BOUNDS", "METRICS", "LabelBound", "MetricSpec", "by_name", "label_table",
           "markdown_table", "names"]

#: Labels that would carry unbounded values (one series per request / key / tenant).
FORBIDDEN_LABELS = frozenset({"request", "request_id", "rid", "key", "key_name", "tenant", "prompt", "salt"})


@dataclass(frozen=True)
class LabelBound:
    """How many values one exporter can give a label, and where they come from."""

    values: int  # the most distinct values one exporter exports (with the defaults, when ``configured``)
    source: str  # where the values come from
    configured: bool = False  # True: the bound follows the deployment's configuration (pools, GPUs, --top)


#: Every exported label and its bound. Values are closed sets in the code or capped by it; no label value is
#: derived from a request, a tenant, a prompt or a key name (a Redis key *pattern* is, capped at --top + 1).
LABEL_BOUNDS: dict[str, LabelBound] = {
    "state": LabelBound(3, "live, retained, orphaned (KV); free, cached, referenced (pool blocks)"),
    "kind": LabelBound(6, "the ledger's EVENT_KINDS; the prefix audit's ANOMALIES"),
    "site": LabelBound(32, "kv-guardian's hook sites (_faults.SITES) and the pre-OOM guard's contained sites"),
    "id": LabelBound(64, "finding ids of the catalog (kvguardian.core.findings.CATALOG)"),
    "name": LabelBound(64, "finding names of the catalog, one per id"),
    "severity": LabelBound(3, "error, warning, info"),
    "source": LabelBound(3, "ledger, pool, findings"),
    "pool": LabelBound(1, "one per pool the program attaches by name (attach_pool): a constant of the code",
                       configured=True),
    "engine": LabelBound(2, "vllm, sglang"),
    "type": LabelBound(4, "BlockStored, BlockRemoved, AllBlocksCleared, unknown"),
    "reason": LabelBound(8, "KV-event decode reasons (kv_events.REASONS); eviction reasons pool_prefix:POOL, "
                            "retained:REASON (declared in code), preempt", configured=True),
    "medium": LabelBound(16, "KV-event media, capped by the prefix audit (16 kept)"),
    "signal": LabelBound(4, "cgroup, kv_budget, cuda:N or nvml:N per GPU, pool:NAME per attached pool",
                         configured=True),
    "action": LabelBound(3, "evict, drain, shed"),
    "cause": LabelBound(3, "interval, allocate, manual"),
    "db": LabelBound(16, "non-empty Redis databases (16 by default; a cluster has only db 0)", configured=True),
    "pattern": LabelBound(51, "mined key patterns: the top --top (50) by bytes, the rest summed under {other}",
                          configured=True),
    "stat": LabelBound(3, "p50, p90, max"),
    "replica": LabelBound(1, "one per replica a `watch` follows (its metrics host:port, from --metrics): only "
                             "when it follows several", configured=True),
    "model_name": LabelBound(1, "the model each followed replica serves (one per replica)", configured=True),
}


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family."""

    name: str  # the sample name as scraped; counters end in _total
    kind: str  # "gauge" or "counter"
    help: str  # the HELP text: what it counts, in which unit
    labels: tuple[str, ...] = ()
    owner: str = "guard"  # which exporter yields it: guard, pool, watch, vllm, oom, redis

    @property
    def family_name(self) -> str:
        """The name prometheus_client families take (counters without ``_total``)."""
        return self.name[: -len("_total")] if self.kind == "counter" else self.name


def _g(name: str, help_: str, labels: tuple[str, ...] = (), owner: str = "guard") -> MetricSpec:
    return MetricSpec(name, "gauge", help_, labels, owner)


def _c(name: str, help_: str, labels: tuple[str, ...] = (), owner: str = "guard") -> MetricSpec:
    return MetricSpec(name, "counter", help_, labels, owner)


_STATE = ("state",)
_POOL = ("pool",)

#: Every metric family kv-guardian exports, grouped by owner.
METRICS: tuple[MetricSpec, ...] = (
    # ---------------------------------------------------------------- guard: the ledger of a running program
    _g("kvguardian_kv_bytes",
       "KV storage bytes tracked by the ledger, by state: live (owner request active), retained (owner ended, "
       "retention declared), orphaned (owner ended, nothing declared it)", _STATE),
    _g("kvguardian_kv_entries", "KV entries (storages, blocks) tracked by the ledger, by state", _STATE),
    _g("kvguardian_kv_residency_ratio",
       "KV bytes whose owner request has ended (retained + orphaned) / all tracked KV bytes; 0 when nothing "
       "is tracked"),
    _g("kvguardian_kv_fragmentation_ratio",
       "KV bytes allocated but holding no token (unused static capacity, empty block slots, storage kept alive "
       "by a cropped view) / all tracked KV bytes"),
    _c("kvguardian_kv_released_bytes_total", "KV storage bytes released (freed) since the ledger started"),
    _c("kvguardian_kv_released_entries_total", "KV entries released (freed) since the ledger started"),
    _c("kvguardian_kv_lifecycle_events_total",
       "KV lifecycle events recorded by the ledger, by kind (init, append, hit, evict, release, pressure)", ("kind",)),
    _g("kvguardian_requests_active", "Requests the guard sees as active (started, not ended)"),
    _g("kvguardian_model_generation", "Model generation of the ledger (a declared reload increments it)"),
    _c("kvguardian_guard_instrumentation_errors_total",
       "Errors inside kv-guardian's own hooks, contained by fail-open, by hook site", ("site",)),
    _c("kvguardian_guard_events_dropped_total",
       "Lifecycle events dropped because the ledger's bounded event buffer was full"),
    _g("kvguardian_findings",
       "Findings of the latest check, one series per finding id (severity: the catalog's for the id; the "
       "value counts the id's findings of any severity; 0 for ids with no finding)",
       ("id", "name", "severity")),
    _g("kvguardian_last_check_timestamp_seconds",
       "Unix time of the latest check whose findings are exported; 0 before the first check"),
    _c("kvguardian_exporter_source_errors_total",
       "Errors while reading a source during a scrape (the source is skipped for that scrape), by source",
       ("source",)),
    # ---------------------------------------------------------------- pool: a paged block pool attached to the exporter
    _g("kvguardian_pool_blocks",
       "Blocks of a paged KV pool by state: free (unused, holds no cached prefix), cached (unreferenced, "
       "holds a reusable prefix), referenced (in a live block table)", ("pool", "state"), "pool"),
    _g("kvguardian_pool_capacity_blocks", "Blocks in a paged KV pool (its capacity)", _POOL, "pool"),
    _g("kvguardian_pool_residency_ratio",
       "Pool blocks whose owner has ended / allocated pool blocks, as the pool reports it", _POOL, "pool"),
    _g("kvguardian_pool_fragmentation_ratio",
       "Token slots allocated but empty in the pool's blocks / allocated token slots, as the pool reports it",
       _POOL, "pool"),
    _c("kvguardian_pool_prefix_queries_total", "Prefix-cache lookups made against the pool", _POOL, "pool"),
    _c("kvguardian_pool_prefix_hits_total", "Prefix-cache lookups that found a cached block", _POOL, "pool"),
    _g("kvguardian_pool_prefix_hit_ratio",
       "Prefix-cache hits / queries since the pool started, as the pool reports it", _POOL, "pool"),
    _c("kvguardian_pool_evictions_total", "Cached blocks evicted from the pool to make room", _POOL, "pool"),
    # ---------------------------------------------------------------- watch: kv-guardian watch vllm|sglang
    _c("kvguardian_watch_scrapes_total", "Metrics scrapes of the watched server, by engine", ("engine",), "watch"),
    _c("kvguardian_watch_scrape_errors_total",
       "Failed metrics scrapes of the watched server (connection, HTTP status, parse), by engine",
       ("engine",), "watch"),
    _g("kvguardian_watch_idle_kv_seconds",
       "Longest time any watched engine has reported KV usage while running and queueing no request; "
       "0 when none does", ("engine",), "watch"),
    _g("kvguardian_watch_sglang_unaccounted_tokens",
       "SGLang KV token slots that are neither available, evictable, used nor session-held "
       "(max_total - the rest), largest over the watched ranks", (), "watch"),
    _c("kvguardian_watch_kv_event_batches_total", "KV event batches received from the publisher (live and replayed)",
       (), "watch"),
    _c("kvguardian_watch_kv_events_total",
       "KV events applied to the prefix index, by type (BlockStored, BlockRemoved, AllBlocksCleared, unknown)",
       ("type",), "watch"),
    _c("kvguardian_watch_kv_event_gaps_total", "Sequence-number gaps seen in the KV event stream", (), "watch"),
    _c("kvguardian_watch_kv_event_batches_replayed_total",
       "KV event batches recovered through the publisher's replay socket", (), "watch"),
    _c("kvguardian_watch_kv_event_batches_lost_total",
       "KV event batches lost in a gap and not recovered by replay", (), "watch"),
    _c("kvguardian_watch_kv_event_errors_total",
       "KV event frames or events that could not be decoded, by reason", ("reason",), "watch"),
    _c("kvguardian_watch_kv_event_anomalies_total",
       "KV events that decoded but did not fit the index (removal of an unknown hash, duplicate store, "
       "index full), by kind", ("kind",), "watch"),
    _g("kvguardian_watch_prefix_index_blocks",
       "Blocks in the prefix-cache index rebuilt from KV events, by medium", ("medium",), "watch"),
    _g("kvguardian_watch_prefix_namespaces",
       "Distinct prefix namespaces (cache salts) seen in KV events, including the unsalted one", (), "watch"),
    _c("kvguardian_watch_prefix_clears_total", "AllBlocksCleared events and publisher restarts seen", (), "watch"),
    # ---------------------------------------------------------------- oom: the pre-OOM guard (in-process or oom-guard)
    _g("kvguardian_memory_pressure_ratio",
       "Used / limit of each memory signal the pre-OOM guard samples (cgroup, cuda:N, nvml:N, pool:NAME, "
       "kv_budget); absent for a signal with no limit or that cannot be read", ("signal",), "oom"),
    _g("kvguardian_memory_used_bytes",
       "What counts against the limit of each memory signal (cgroup: usage minus inactive file cache)",
       ("signal",), "oom"),
    _g("kvguardian_memory_limit_bytes", "The limit of each memory signal; absent when none is set", ("signal",),
       "oom"),
    _g("kvguardian_memory_signal_up",
       "Whether the last read of a memory signal succeeded (1) or failed (0: fail-open, the others are kept)",
       ("signal",), "oom"),
    _c("kvguardian_memory_signal_errors_total", "Failed reads of a memory signal", ("signal",), "oom"),
    _c("kvguardian_memory_oom_kills_total",
       "OOM kills the kernel counted in a watched cgroup (memory.events oom_kill, v1 memory.oom_control)",
       ("signal",), "oom"),
    _g("kvguardian_oom_watermark_ratio", "The guard's watermarks, by action: evict, drain, shed", ("action",),
       "oom"),
    _g("kvguardian_oom_draining",
       "Whether the guard drains (1: pressure above the drain watermark, or a preStop drain) or not (0)", (), "oom"),
    _g("kvguardian_oom_ready", "Readiness as the guard reports it on /ready (1 ready, 0 not)", (), "oom"),
    _g("kvguardian_oom_in_flight_requests", "Requests admitted by the guard and not finished yet", (), "oom"),
    _c("kvguardian_oom_evictions_total",
       "Things evicted under memory pressure, by reason: pool_prefix:POOL (blocks), retained:REASON (caches "
       "asked to evict), preempt (requests preempted, recomputed later)", ("reason",), "oom"),
    _c("kvguardian_oom_evicted_bytes_total", "Bytes freed by evictions under memory pressure, when known, by reason",
       ("reason",), "oom"),
    _c("kvguardian_oom_rejected_admissions_total",
       "New requests refused with 503 + Retry-After while draining or because they would cross the drain "
       "watermark", (), "oom"),
    _c("kvguardian_oom_shed_requests_total",
       "In-flight requests ended early with 503 + Retry-After because memory still rose while draining", (), "oom"),
    _c("kvguardian_oom_samples_total", "Samples of the memory signals, by cause: interval, allocate, manual",
       ("cause",), "oom"),
    _c("kvguardian_oom_guard_errors_total", "Errors inside the pre-OOM guard, contained (fail-open), by site",
       ("site",), "oom"),
    # ---------------------------------------------------------------- vllm: the in-process audit of vLLM's pool
    # (served from vLLM's engine-core process with KVG_VLLM_AUDIT_PORT, next to kvguardian_findings and
    # kvguardian_pool_*{pool="vllm"})
    _c("kvguardian_vllm_audit_checks_total", "Full audits of vLLM's block pool and block tables run so far", (),
       "vllm"),
    _c("kvguardian_vllm_audit_seconds_total", "Time spent in full audits of vLLM's block pool", (), "vllm"),
    _c("kvguardian_vllm_audit_errors_total",
       "Checks of the vLLM audit that failed and were contained (fail-open; vLLM unaffected)", (), "vllm"),
    _g("kvguardian_vllm_audit_enabled", "Whether the vLLM audit is running (0 after too many contained errors)",
       (), "vllm"),
    _g("kvguardian_vllm_lost_free_requests",
       "Requests vLLM no longer runs whose block tables still hold blocks (lost frees), as of the last audit",
       (), "vllm"),
    _g("kvguardian_vllm_blocks_lost", "KV blocks of vLLM held by requests that are no longer live (lost frees)", (),
       "vllm"),
    # ---------------------------------------------------------------- redis: kv-guardian redis exporter (issue 5)
    # O(1) on every scrape: INFO keyspace + INFO memory
    _g("kvguardian_redis_up", "Whether the last scrape reached Redis (1) or not (0)", (), "redis"),
    _g("kvguardian_redis_scrape_duration_seconds", "Time the INFO calls of this scrape took", (), "redis"),
    _g("kvguardian_redis_keys", "Keys per database (INFO keyspace)", ("db",), "redis"),
    _g("kvguardian_redis_keys_with_ttl", "Keys with a TTL per database (INFO keyspace expires)", ("db",), "redis"),
    _g("kvguardian_redis_keys_without_ttl", "Keys with no TTL per database (INFO keyspace: keys - expires)",
       ("db",), "redis"),
    _g("kvguardian_redis_used_memory_bytes", "INFO memory used_memory", (), "redis"),
    _g("kvguardian_redis_used_memory_dataset_bytes", "INFO memory used_memory_dataset", (), "redis"),
    _g("kvguardian_redis_maxmemory_bytes", "INFO memory maxmemory (0: no limit)", (), "redis"),
    # the last completed sweep (patterns bounded: the top ones by bytes, the rest summed under {other})
    _g("kvguardian_redis_pattern_keys", "Keys per mined key pattern in the last completed sweep", ("pattern",),
       "redis"),
    _g("kvguardian_redis_pattern_bytes", "Bytes (MEMORY USAGE) per mined key pattern in the last completed sweep",
       ("pattern",), "redis"),
    _g("kvguardian_redis_pattern_no_ttl_keys", "Keys with no TTL per key pattern in the last completed sweep",
       ("pattern",), "redis"),
    _g("kvguardian_redis_pattern_no_ttl_bytes",
       "Bytes of keys with no TTL per mined key pattern in the last completed sweep", ("pattern",), "redis"),
    _g("kvguardian_redis_pattern_cold_keys", "No-TTL keys per pattern idle past the cold threshold", ("pattern",),
       "redis"),
    _g("kvguardian_redis_pattern_cold_bytes", "Bytes of a pattern's cold no-TTL keys", ("pattern",), "redis"),
    _g("kvguardian_redis_pattern_idle_seconds",
       "Idle time (OBJECT IDLETIME) of a pattern's keys at the last sweep, by stat: p50, p90, max",
       ("pattern", "stat"), "redis"),
    _g("kvguardian_redis_sweep_duration_seconds", "How long the last completed key-space sweep took", (), "redis"),
    _g("kvguardian_redis_sweep_timestamp_seconds", "Unix time the last completed key-space sweep finished", (),
       "redis"),
    _g("kvguardian_redis_sweep_keys", "Keys probed by the last completed sweep", (), "redis"),
    _g("kvguardian_redis_sweep_patterns", "Patterns found by the last completed sweep", (), "redis"),
    _g("kvguardian_redis_sweep_complete",
       "Whether the last completed sweep covered the whole key space (1) or stopped early (0)", (), "redis"),
    _g("kvguardian_redis_findings", "Findings (KVG3xx) of the last completed sweep, by id and severity",
       ("id", "severity"), "redis"),
    _c("kvguardian_redis_sweeps_total", "Sweeps finished (complete or not)", (), "redis"),
    _c("kvguardian_redis_sweep_errors_total", "Sweeps that failed or came back incomplete", (), "redis"),
    _g("kvguardian_redis_sweep_running", "Whether a sweep is running now (1) or not (0)", (), "redis"),
)

_BY_NAME = {m.name: m for m in METRICS}


def by_name(name: str) -> MetricSpec:
    """The spec of ``name``; raises `KeyError` naming the catalog when it is not there."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in kvguardian.core.exporters.catalog.METRICS; add it there first") from None


def names(owner: str | None = None) -> list[str]:
    """Exported sample names (of one owner, or all)."""
    return [m.name for m in METRICS if owner is None or m.owner == owner]


def markdown_table() -> str:
    """The metric table (Markdown), generated from `METRICS`."""
    rows = ["| metric | type | labels | exported by | meaning |", "|---|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(m.labels) if m.labels else "—"
        rows.append(f"| `{m.name}` | {m.kind} | {labels} | {m.owner} | {m.help} |")
    return "\n".join(rows)


def label_table() -> str:
    """The label table (Markdown): each label's bound and where its values come from, generated from
    `LABEL_BOUNDS`."""
    rows = ["| label | most values per family | set by the configuration | values |", "|---|---|---|---|"]
    for label, b in LABEL_BOUNDS.items():
        rows.append(f"| `{label}` | {b.values} | {'yes' if b.configured else 'no'} | {b.source} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())
