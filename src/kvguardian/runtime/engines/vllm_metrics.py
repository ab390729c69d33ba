"""vLLM from its ``/metrics``: KV usage while idle (KVG207) and sleep/wake transitions (for the event audit).

The black-box leak signal: ``vllm:kv_cache_usage_perc`` (a 0-1 ratio despite its name) stays above 0 while
``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` are both 0, for longer than a grace period.
vLLM counts cached-but-unreferenced prefix blocks as free (``usage = 1 - free / (num_gpu_blocks - 1)``), so
an idle healthy server reports 0 even with a warm prefix cache: any usage left is blocks some request still
references. Blocks are derived from ``vllm:cache_config_info``'s ``num_gpu_blocks`` and ``block_size`` labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Finding, Severity
from kvguardian.runtime.engines.board import FindingBoard
from kvguardian.runtime.engines.promtext import Sample, Scrape

__all__ = ["METRICS_READ", "CacheConfig", "VllmMetricsCheck"]

USAGE = "vllm:kv_cache_usage_perc"
USAGE_LEGACY = "vllm:gpu_cache_usage_perc"  # vLLM < 0.10 name of the same ratio
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
CACHE_CONFIG = "vllm:cache_config_info"
SLEEP_STATE = "vllm:engine_sleep_state"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"

#: vLLM metrics kv-guardian reads (the watcher) or queries (rules and dashboard).
METRICS_READ = (USAGE, USAGE_LEGACY, RUNNING, WAITING, CACHE_CONFIG, SLEEP_STATE, PREFIX_QUERIES, PREFIX_HITS,
                PREEMPTIONS)

EngineKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class CacheConfig:
    block_size: int | None
    num_gpu_blocks: int | None


def _int_label(s: Sample, name: str) -> int | None:
    try:
        return int(s.labels[name])
    except (KeyError, ValueError):
        return None  # vLLM writes "None" before the pool is sized


def _matching(samples: Sequence[Sample], key: EngineKey) -> Sample | None:
    """The sample with exactly ``key``'s labels, else the one with the same ``engine`` label, else the only one."""
    labels = dict(key)
    for s in samples:
        if s.key() == key:
            return s
    same_engine = [s for s in samples if "engine" in labels and s.labels.get("engine") == labels["engine"]]
    if len(same_engine) == 1:
        return same_engine[0]
    return samples[0] if len(samples) == 1 else None


@dataclass
class _Engine:
    idle_since: float | None = None  # when usage > 0 with nothing running or waiting began
    awake: bool | None = None  # from vllm:engine_sleep_state, when exported


class VllmMetricsCheck:
    """Feed it each scrape; it raises and resolves KVG207 on the board and reports sleep/wake transitions."""

    def __init__(self, board: FindingBoard, *, grace: float = 60.0, min_usage: float = 0.0) -> None:
        if grace < 0 or not 0 <= min_usage < 1:
            raise UsageError(f"grace must be >= 0 s and min usage in [0, 1), got {grace!r}, {min_usage!r}")
        self.board = board
        self.grace = grace
        self.min_usage = min_usage
        self._engines: dict[EngineKey, _Engine] = {}
        self.cache_config: dict[EngineKey, CacheConfig] = {}
        self.prefix_queries = 0.0  # vllm:prefix_cache_queries_total summed over engines (prompt tokens looked up)
        self.prefix_hits = 0.0  # vllm:prefix_cache_hits_total summed over engines (tokens served from the cache)

    def observe(self, scrape: Scrape, now: float) -> list[tuple[str, EngineKey]]:
        """Update the idle check from one scrape; returns transitions ``("sleep"|"wake", engine key)``.

        Raises:
            UsageError: the page has no vLLM KV usage metric (the URL is not a vLLM server's /metrics).
        """
        usage = scrape.first(USAGE, USAGE_LEGACY)
        if not usage:
            raise UsageError(
                f"the metrics page has no {USAGE} (nor {USAGE_LEGACY}); fix: point --metrics at a vLLM "
                "server's /metrics (vLLM >= 0.6 with metrics enabled)"
            )
        self.prefix_queries = sum(x.value for x in scrape.get(PREFIX_QUERIES, []))
        self.prefix_hits = sum(x.value for x in scrape.get(PREFIX_HITS, []))
        transitions: list[tuple[str, EngineKey]] = []
        running, waiting = scrape.get(RUNNING, []), scrape.get(WAITING, [])
        for s in usage:
            key = s.key()
            eng = self._engines.setdefault(key, _Engine())
            cfg_sample = _matching(scrape.get(CACHE_CONFIG, []), key)
            if cfg_sample is not None:
                self.cache_config[key] = CacheConfig(_int_label(cfg_sample, "block_size"),
                                                     _int_label(cfg_sample, "num_gpu_blocks"))
            transitions.extend(self._sleep_state(scrape, key, eng))
            r, w = _matching(running, key), _matching(waiting, key)
            idle = r is not None and w is not None and r.value == 0 and w.value == 0
            if idle and s.value > self.min_usage:
                if eng.idle_since is None:
                    eng.idle_since = now
                if now - eng.idle_since >= self.grace:
                    self.board.raise_(("KVG207", key), self._finding(key, s.value, now - eng.idle_since), now)
            else:
                eng.idle_since = None
                self.board.resolve(("KVG207", key), now)
        return transitions

    def _sleep_state(self, scrape: Scrape, key: EngineKey, eng: _Engine) -> list[tuple[str, EngineKey]]:
        # vLLM sets sleep_state="awake" to 1 when awake and 0 asleep (weights_offloaded / discard_all mark the level)
        flags = [s for s in scrape.get(SLEEP_STATE, [])
                 if s.labels.get("sleep_state") == "awake" and s.key(drop=("sleep_state",)) == key]
        if not flags:
            return []
        awake = flags[0].value == 1
        before, eng.awake = eng.awake, awake
        if before is None or before == awake:
            return []
        return [("wake" if awake else "sleep", key)]

    def _finding(self, key: EngineKey, usage: float, idle_for: float) -> Finding:
        cfg = self.cache_config.get(key, CacheConfig(None, None))
        blocks = tokens = None
        if cfg.num_gpu_blocks:
            blocks = round(usage * (cfg.num_gpu_blocks - 1))  # vLLM excludes its null block from the ratio
            tokens = blocks * cfg.block_size if cfg.block_size else None
        held = f" ({blocks} of {cfg.num_gpu_blocks - 1} blocks)" if blocks is not None and cfg.num_gpu_blocks else ""
        engine = ",".join(f"{k}={v}" for k, v in key) or "(no labels)"
        return Finding(
            id="KVG207",
            severity=Severity.WARNING,
            message=(
                f"vLLM {engine} reports KV usage {usage:.2%}{held} while it runs and queues no request, "
                f"for {idle_for:.1f} s (grace {self.grace:g} s)"
            ),
            evidence={
                "engine_labels": dict(key),
                "kv_cache_usage_ratio": usage,
                "blocks_held": blocks,
                "tokens_held": tokens,
                "num_gpu_blocks": cfg.num_gpu_blocks,
                "block_size": cfg.block_size,
                "idle_seconds": round(idle_for, 3),
                "grace_seconds": self.grace,
                "note": "KV events cannot show this: allocation and free are silent in vLLM's event stream",
            },
        )

    def idle_seconds(self, now: float) -> float:
        """Longest current stretch of KV usage while idle, over the engines (0 when none)."""
        engines = list(self._engines.values())  # list(): the exporter reads this from its own thread
        spans = [now - e.idle_since for e in engines if e.idle_since is not None]
        return max(spans, default=0.0)

    def block_size(self) -> int | None:
        """``block_size`` of the engines (the largest if several report it), or None before it is known."""
        known = [c.block_size for c in self.cache_config.values() if c.block_size]
        return max(known) if known else None

    def capacity_blocks(self) -> int | None:
        """``num_gpu_blocks`` of the engine (the largest if several report it), or None before it is known."""
        known = [c.num_gpu_blocks for c in self.cache_config.values() if c.num_gpu_blocks]
        return max(known) if known else None
