"""The scan: SCAN every master, probe each batch read-only, mine patterns, accumulate per-pattern stats.

`scan` never sends KEYS, a write, or a command that resets idle time (see `probe`), and keeps one request in
flight per node. It always returns a `ScanResult`: complete when every cursor came back to 0, else incomplete
with reason ``"sample"``, ``"interrupted"`` or ``"connection lost: …"`` (never retried: a restarted server is
another state). Details: docs/design/keyspace.md.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvguardian.core.errors import UsageError
from kvguardian.keyspace.connect import Topology, connect, discover, display_url
from kvguardian.keyspace.counting import Counting, InProcess, MinerProcess, can_fork
from kvguardian.keyspace.pacing import BatchSizer, lower_priority

if TYPE_CHECKING:
    import redis
from kvguardian.keyspace.patterns import OVERFLOW, OVERFLOW_ID, PatternMiner
from kvguardian.keyspace.probe import Lane, choose_mode
from kvguardian.keyspace.result import ScanResult, key_text
from kvguardian.keyspace.stats import PatternStats
from kvguardian.keyspace.walk import Bounds, Walk

__all__ = ["ScanOptions", "mine_and_count", "parse_duration", "scan", "warn_overflow"]

Progress = Callable[[int, int], None]  # (keys probed so far, total expected)
IDLE_UNKNOWN = "idle times unknown"  # incomplete_reason of a full scan whose idle times could not be read
MAX_SECONDS = 3650 * 86400.0  # longest duration accepted (ten years; Redis idle times wrap long before)


@dataclass
class ScanOptions:
    """How to scan. Defaults bound what one call costs the server (adaptive batch, ≤ 0.5 ms a call) and run
    the client work at a lower CPU priority, so a concurrent load keeps its latency (bench/redis_scan.py)."""

    batch: int = 0  # keys per SCAN COUNT and probe call; 0: adapt to max_call_ms (kvguardian.keyspace.pacing)
    max_call_ms: float = 0.5  # with batch 0: the longest a probe call may hold the server
    nice: int = 10  # mining and statistics run reniced by this much (keyspace.counting); 0: as the caller
    max_keys_per_sec: float | None = None  # rate limit over the whole scan
    sample: int | None = None  # stop after this many keys (a quick look)
    mode: str = "auto"  # "auto", "lua" or "pipeline"
    cold_after: float = 7 * 86400.0  # seconds idle (LRU) that make a no-TTL key cold
    cold_freq: int = 0  # under LFU: a no-TTL key whose counter decayed to this or below is cold
    max_patterns: int = 500
    collapse_after: int = 20
    match: str | None = None  # SCAN MATCH glob
    timeout: float = 10.0  # socket timeout: a dead server ends the scan, never hangs it
    replicas: bool = False  # a Cluster: read each shard's replica (READONLY) instead of its master

    def check(self) -> None:
        """Raises `UsageError` naming the option, the value and the range."""
        if not 0 <= self.batch <= 10_000:
            raise UsageError(f"--batch {self.batch} is out of range; use 1..10000, or 0 to adapt to --max-call-ms")
        if not 0.05 <= self.max_call_ms <= 1000:
            raise UsageError(f"--max-call-ms {self.max_call_ms:g} is out of range; use 0.05..1000 (default 0.5)")
        if not 0 <= self.nice <= 19:
            raise UsageError(f"--nice {self.nice} is out of range; use 0..19")
        if self.max_keys_per_sec is not None and not 1 <= self.max_keys_per_sec <= 1e9:
            raise UsageError(f"--max-keys-per-sec {self.max_keys_per_sec:g} is out of range; fix: use 1..1e9 "
                             "keys per second")
        if self.sample is not None and self.sample <= 0:
            raise UsageError(f"--sample {self.sample} must be > 0")
        if self.mode not in ("auto", "lua", "pipeline"):
            raise UsageError(f"--mode {self.mode!r}: use auto, lua or pipeline")
        if not 0 <= self.cold_after <= MAX_SECONDS:
            raise UsageError(f"--cold-after {self.cold_after:g} s is out of range; fix: use 0..3650d")
        if not 0 < self.timeout <= 3600:
            raise UsageError(f"--timeout {self.timeout:g} must be a number of seconds in (0, 3600]; fix: e.g. 10")
        for name, value, low in (("--cold-freq", self.cold_freq, 0), ("--max-patterns", self.max_patterns, 1),
                                 ("--collapse-after", self.collapse_after, 1)):
            if value < low:
                raise UsageError(f"{name} {value} must be >= {low}")


def parse_duration(text: str, flag: str = "duration") -> float:
    """``"90"``, ``"90s"``, ``"15m"``, ``"6h"``, ``"7d"`` → seconds (finite, ≥ 0, at most 3650 days);
    `UsageError` naming ``flag`` otherwise."""
    t = text.strip().lower()
    mult = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    try:
        seconds = float(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else float(t)
    except ValueError:
        raise UsageError(f"bad duration for {flag}: {text!r}; use seconds or a unit: 90s, 15m, 6h, 7d") from None
    if not 0 <= seconds <= MAX_SECONDS:  # NaN fails too
        raise UsageError(f"{flag} {text!r} is out of range; fix: use 0 to 3650d")
    return seconds


def mine_and_count(miner: PatternMiner, stats: PatternStats, keys: list[bytes], probe: np.ndarray) -> None:
    """Mine one batch's key names and add the probe to the per-pattern statistics."""
    ids = miner.pattern_ids_bytes(keys)
    pids = np.fromiter(ids, dtype=np.int64, count=len(ids))  # a flat list: no shape discovery
    stats.ensure(miner.size)
    stats.add_batch(pids, keys, probe)


class _Count:
    """A scan's mining and statistics (`kvguardian.keyspace.counting.Batches`). The statistics cost ~15
    numpy calls a batch whatever its size, so small batches (the pacing keeps calls short) are counted a
    few thousand keys at a time."""

    FLUSH_AT = 4096

    def __init__(self, opts: ScanOptions, idle_metric: str) -> None:
        cold = float(opts.cold_freq) if idle_metric == "freq" else opts.cold_after
        self.stats = PatternStats(cold_after=int(cold), idle_metric=idle_metric)
        self.miner = PatternMiner(max_patterns=opts.max_patterns, collapse_after=opts.collapse_after,
                                  on_merge=self.stats.merge)
        self.keys: list[bytes] = []
        self.probes: list[np.ndarray] = []

    def add(self, keys: list[bytes], probe: np.ndarray) -> None:
        self.keys += keys
        self.probes.append(probe)
        if len(self.keys) >= self.FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        if self.keys:
            probe = self.probes[0] if len(self.probes) == 1 else np.concatenate(self.probes)
            mine_and_count(self.miner, self.stats, self.keys, probe)
        self.keys, self.probes = [], []

    def outcome(self) -> tuple[list[dict[str, Any]], int]:
        self.flush()
        return build_patterns(self.miner, self.stats), self.stats.keys_vanished


def scan(url: str, options: ScanOptions | None = None, *, progress: Progress | None = None,
          stop: threading.Event | None = None, client: redis.Redis | None = None) -> ScanResult:
    """Scan the Redis (or Redis Cluster) at ``url``; see the module docstring for how it ends.

    With ``options.nice`` (the default) the scan runs in a thread of its own and its mining and statistics
    in a forked child at a lower CPU priority (`kvguardian.keyspace.counting`; where fork is missing, the
    thread itself is reniced); the calling thread waits for it (Ctrl-C there stops the scan: a partial
    result, as always).

    Raises:
        UsageError: bad options or URL, a server that cannot be reached at the start, a missing ACL permission.
    """
    opts = options or ScanOptions()
    opts.check()
    if opts.nice <= 0:
        return _scan(url, opts, progress, stop, client)
    stop = stop if stop is not None else threading.Event()
    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        if not can_fork():  # the mining cannot go to a reniced child: renice this whole thread
            lower_priority(opts.nice)
        try:
            box["result"] = _scan(url, opts, progress, stop, client)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=work, name="kvguardian-scan", daemon=True).start()
    while not done.is_set():  # an Event, not Thread.join: a join interrupted by Ctrl-C can lose track of the thread
        try:
            done.wait(0.2)
        except KeyboardInterrupt:
            stop.set()
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]


def _scan(url: str, opts: ScanOptions, progress: Progress | None, stop: threading.Event | None,
           client: redis.Redis | None) -> ScanResult:
    seed = client if client is not None else connect(url, timeout=opts.timeout)
    topo = discover(seed, url, replicas=opts.replicas)
    sub = "FREQ" if topo.idle_metric == "freq" else "IDLETIME"
    mode, why = choose_mode(topo.nodes[0].client, topo.version_tuple, sub, opts.mode)
    cold = float(opts.cold_freq) if topo.idle_metric == "freq" else opts.cold_after
    result = ScanResult(target=display_url(url), started=time.time(), mode=mode, mode_reason=why,
                        idle_metric=topo.idle_metric, cold_after=cold, dbsize=topo.dbsize, sample=opts.sample,
                        warnings=list(topo.warnings))
    _warn_uptime(topo, result, opts)
    match = opts.match.encode() if opts.match else None
    sizers = [BatchSizer(opts.max_call_ms / 1000) for _ in topo.nodes] if opts.batch == 0 else []
    lanes = [Lane(n.client, n.addr, mode=mode, sub=sub, batch=opts.batch or sizers[i].batch, match=match)
             for i, n in enumerate(topo.nodes)]
    total = min(topo.dbsize, opts.sample) if opts.sample else topo.dbsize
    make = functools.partial(_Count, opts, topo.idle_metric)
    counting: Counting = MinerProcess(make, opts.nice) if opts.nice > 0 and can_fork() else InProcess(make)
    walk = Walk(lanes, sizers, counting, Bounds(sample=opts.sample, rate=opts.max_keys_per_sec, progress=progress,
                                                total=total, stop=stop))
    try:
        walk.run()
        patterns, vanished = counting.finish()  # what was probed before an interruption counts too
    finally:
        counting.close()  # a refused permission: no result, and no mining child left behind
    result.finished = time.time()
    result.keys_scanned = walk.done
    result.keys_vanished = vanished
    _say_ending(topo, walk, result)
    result.server = {
        "version": topo.version, "cluster": topo.cluster, "maxmemory_policy": topo.policy,
        "nodes": [{"addr": n.addr, "role": n.role, "dbsize": n.dbsize, "uptime_s": n.uptime_s,
                   "keys_scanned": walk.totals[i].keys, "bytes": walk.totals[i].bytes,
                   "error": walk.totals[i].error} for i, n in enumerate(topo.nodes)],
    }
    if topo.cluster:
        result.server.update(shards=topo.shards, read_from="replicas" if opts.replicas else "masters",
                             unreachable=list(topo.unreachable))
    result.server["pacing"] = _pacing(opts, sizers, lanes)
    _mark_idle_unknown(topo, result)
    result.patterns = patterns
    result.bytes = sum(p["bytes"] for p in result.patterns)
    warn_overflow(result, opts)
    return result


def warn_overflow(result: ScanResult, opts: ScanOptions) -> None:
    """Say so when keys were counted under the overflow pattern (a live scan and an RDB read alike)."""
    if any(p["overflow"] and p["keys"] for p in result.patterns):
        result.warnings.append(f"more than {opts.max_patterns} patterns: the rest are counted under {OVERFLOW}; "
                               "raise --max-patterns to split them")


def _pacing(opts: ScanOptions, sizers: list[BatchSizer], lanes: list[Lane]) -> dict[str, Any]:
    """How the scan paced itself (server.pacing in the JSON)."""
    if not sizers:
        return {"batch": opts.batch, "adaptive": False, "nice": opts.nice}
    worst = max(s.worst_call_s for s in sizers)
    per_key = [s.per_key_s for s in sizers if s.per_key_s is not None]
    return {"adaptive": True, "max_call_ms": opts.max_call_ms, "nice": opts.nice,
            "batch_last": [lane.batch for lane in lanes], "worst_call_ms": round(worst * 1000, 3),
            "server_us_per_key": round(1e6 * sum(per_key) / len(per_key), 2) if per_key else None}


def _say_ending(topo: Topology, walk: Walk, result: ScanResult) -> None:
    """How the scan ended, in ``complete``/``incomplete_reason``: the sample, an interruption, or shards lost
    (at the start or mid-walk: one line naming the first, the others in the warnings)."""
    if walk.sampled:
        result.complete, result.incomplete_reason = False, "sample"
    lost = list(topo.unreachable) + [f"{topo.nodes[i].addr} lost after {t.keys} of its keys ({t.error})"
                                     for i, t in enumerate(walk.totals) if t.error is not None]
    if lost and not topo.cluster:
        result.complete = False
        result.incomplete_reason = f"connection lost after {walk.done} keys: {walk.totals[0].error}"
    elif lost:
        result.complete = False
        result.incomplete_reason = (f"connection lost to {len(lost)} of {topo.shards} shards ({lost[0]}); the "
                                    "keys of the other shards are counted")
        result.warnings.extend(lost)
    if walk.interrupted:
        result.complete, result.incomplete_reason = False, "interrupted"
    moved = sum(lane.moved for lane in walk.lanes)
    if moved:
        result.warnings.append(f"{moved} keys answered MOVED/ASK (a resharding was under way): they are counted as "
                               "vanished here and may also be counted on their new shard; scan again once "
                               "redis-cli --cluster check HOST:PORT shows no open slots")


def _mark_idle_unknown(topo: Topology, result: ScanResult) -> None:
    """Without idle times the scan saw every key but cannot judge coldness: warn and mark it incomplete."""
    if topo.idle_unknown is None:
        return
    result.warnings.append(topo.idle_unknown)
    if result.complete:
        result.complete, result.incomplete_reason = False, IDLE_UNKNOWN


def _warn_uptime(topo: Topology, result: ScanResult, opts: ScanOptions) -> None:
    if topo.idle_metric == "idletime":
        young = [n for n in topo.nodes if n.uptime_s < opts.cold_after]
        if young:
            result.warnings.append(
                f"{young[0].addr} has been up {young[0].uptime_s} s, less than --cold-after {opts.cold_after:g} s: "
                "idle times restart at a restart, so no key there can look cold yet")


def build_patterns(miner: PatternMiner, stats: PatternStats) -> list[dict[str, Any]]:
    """The per-pattern rows of a result, largest bytes first, key names decoded."""
    rows = []
    names = miner.patterns()
    for pid in stats.live_ids():
        name = names.get(pid, OVERFLOW)
        row = stats.row(pid)
        for tk in row["top_keys"]:
            tk["key"] = key_text(tk["key"])
        row["example_key"] = key_text(row["example_key"])
        row["example_cold_key"] = key_text(row["example_cold_key"])
        row["example_no_ttl_key"] = key_text(row["example_no_ttl_key"])
        placeholders = sorted({part[1:-1] for part in _placeholders(name)})
        rows.append({"pattern": name, "placeholders": placeholders, "overflow": pid == OVERFLOW_ID, **row})
    rows.sort(key=lambda r: (-r["bytes"], r["pattern"]))
    return rows


def _placeholders(pattern: str) -> list[str]:
    import re

    return re.findall(r"\{(?:uuid|ts_s|ts_ms|ts_us|ts_ns|date|ip|hex|b64|rand|int|str|tag)\}", pattern)
