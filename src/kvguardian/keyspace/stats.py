"""Per-pattern statistics of a scan, accumulated a batch at a time with numpy; memory is bounded.

Per pattern: key count, bytes (sum, histogram for p50, max), keys and bytes with no TTL, cold keys and bytes
(no TTL and idle past the threshold, or an LFU counter at or below it), a TTL distribution in fixed buckets,
an idle (or LFU) histogram for p50/p90 plus the exact max, type counts, collection keys and bytes, and the
top keys by memory. Histograms use log buckets (exact below 16, then four per doubling, so a quantile is
within about ±9 %); nothing grows with the number of keys, only with the number of patterns.
"""

from __future__ import annotations

import builtins
import functools
import heapq
from typing import Any

import numpy as np

__all__ = ["TTL_BUCKETS", "TYPES", "PatternStats", "bucket_of", "quantile"]

#: type codes the probe returns (index → name); -1 means the key vanished before it was probed
TYPES = ("string", "list", "set", "zset", "hash", "stream", "other")
COLLECTIONS = np.array([False, True, True, True, True, True, False])
TYPE_CODE = {name.encode(): i for i, name in enumerate(TYPES)}

#: TTL buckets: (name, upper bound in ms, exclusive); "none" is no TTL
TTL_BUCKETS = (("none", 0), ("lt_1m", 60_000), ("lt_10m", 600_000), ("lt_1h", 3_600_000),
               ("lt_1d", 86_400_000), ("lt_7d", 604_800_000), ("lt_30d", 2_592_000_000), ("ge_30d", 0))
_TTL_EDGES = np.array([b for _, b in TTL_BUCKETS[1:-1]], dtype=np.int64)

NB = 16 + 4 * 44  # histogram buckets: up to 16·2^44 (bytes or seconds)
TOP_K = 5

#: idle-time buckets (seconds since the last read, exclusive upper bounds; the last is open), for the HTML
#: report's histogram; read from the log histogram, so a count near an edge may sit in the neighbour (±9 %)
IDLE_BUCKETS = (("lt_1m", 60), ("lt_10m", 600), ("lt_1h", 3_600), ("lt_1d", 86_400), ("lt_7d", 604_800),
                ("lt_30d", 2_592_000), ("ge_30d", 0))
_IDLE_EDGES = np.array([b for _, b in IDLE_BUCKETS[:-1]], dtype=np.float64)


def bucket_of(values: np.ndarray) -> np.ndarray:
    """Histogram bucket of non-negative integers: exact below 16, then four buckets per doubling."""
    v = np.maximum(values, 0).astype(np.float64)
    big = v >= 16
    out = v.astype(np.int64)
    if big.any():
        out[big] = 16 + np.floor(4 * np.log2(v[big] / 16)).astype(np.int64)
    return np.minimum(out, NB - 1)


def _count_into(table: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> None:
    """``table[rows[i], cols[i]] += 1`` for every i: one `np.bincount` over the flattened cells (about half
    the time of `np.add.at` with a pair of index arrays; counts, so exact)."""
    used = int(rows.max()) + 1 if len(rows) else 0
    width = table.shape[1]
    table[:used] += np.bincount(rows * width + cols, minlength=used * width).reshape(used, width)


def _bucket_value(b: int) -> float:
    """A representative value of a bucket (the geometric middle; exact below 16)."""
    return float(b) if b < 16 else 16 * 2 ** ((b - 16 + 0.5) / 4)


@functools.cache
def _coarse() -> np.ndarray:
    """Fine histogram bucket -> `IDLE_BUCKETS` index."""
    return np.searchsorted(_IDLE_EDGES, [_bucket_value(b) for b in range(NB)], side="right")


def idle_buckets(hist: np.ndarray) -> dict[str, int]:
    """A pattern's idle-time histogram row in `IDLE_BUCKETS` (seconds)."""
    counts = np.bincount(_coarse(), weights=hist, minlength=len(IDLE_BUCKETS))
    return {name: int(c) for (name, _), c in zip(IDLE_BUCKETS, counts)}


def quantile(hist: np.ndarray, q: float, vmax: int) -> int | None:
    """The q-quantile of a histogram row, capped at the exact max; None for an empty row."""
    total = int(hist.sum())
    if total == 0:
        return None
    idx = int(np.searchsorted(np.cumsum(hist), q * total, side="left"))
    return int(min(round(_bucket_value(idx)), vmax))


class PatternStats:
    """Statistics per pattern id, grown as patterns appear. Only the scan thread mutates it."""

    # per pattern id (rows grow with the number of patterns, never with the number of keys)
    keys: np.ndarray  # keys probed
    bytes: np.ndarray  # sum of MEMORY USAGE
    bytes_max: np.ndarray
    nottl_keys: np.ndarray  # PTTL -1
    nottl_bytes: np.ndarray
    cold_keys: np.ndarray  # no TTL and idle ≥ cold_after (or LFU counter ≤ cold_after)
    cold_bytes: np.ndarray
    coll_keys: np.ndarray  # lists, sets, sorted sets, hashes, streams
    coll_bytes: np.ndarray
    idle_max: np.ndarray  # -1 before any key
    topmin: np.ndarray  # smallest bytes in the top-K heap once it is full, else -1
    types: np.ndarray  # [P, len(TYPES)]
    ttl: np.ndarray  # [P, len(TTL_BUCKETS)]
    mem_hist: np.ndarray  # [P, NB]
    idle_hist: np.ndarray  # [P, NB]

    def __init__(self, *, cold_after: int, idle_metric: str = "idletime", capacity: int = 64) -> None:
        self.cold_after = cold_after  # seconds of idle (idletime) or an LFU counter ceiling (freq)
        self.idle_metric = idle_metric  # "idletime" or "freq"
        self.keys_vanished = 0  # scanned, then gone (expired or deleted) before the probe
        self._cap = 0
        self._grow(capacity)
        # per pid: a min-heap of (bytes, key, type, pttl, idle) holding the TOP_K largest keys
        self.top: list[list[tuple[int, builtins.bytes, int, int, int]]] = []
        self.example: list[builtins.bytes | None] = []
        self.cold_example: list[builtins.bytes | None] = []
        self.nottl_example: list[builtins.bytes | None] = []  # a key of the pattern with no TTL
        self._alias = np.arange(self._cap, dtype=np.int64)

    # -- storage ------------------------------------------------------------------------------------------
    _SCALARS = ("keys", "bytes", "bytes_max", "nottl_keys", "nottl_bytes", "cold_keys", "cold_bytes",
                "coll_keys", "coll_bytes", "idle_max", "topmin")

    def _grow(self, need: int) -> None:
        cap = max(need, 2 * self._cap, 64)
        old = self._cap
        for name in self._SCALARS:
            arr = np.full(cap, -1 if name in ("topmin", "idle_max") else 0, dtype=np.int64)
            if old:
                arr[:old] = getattr(self, name)
            setattr(self, name, arr)
        for name, width in (("types", len(TYPES)), ("ttl", len(TTL_BUCKETS)), ("mem_hist", NB), ("idle_hist", NB)):
            arr2 = np.zeros((cap, width), dtype=np.int64)
            if old:
                arr2[:old] = getattr(self, name)
            setattr(self, name, arr2)
        if old:
            alias = np.arange(cap, dtype=np.int64)
            alias[:old] = self._alias
            self._alias = alias
        self._cap = cap

    def ensure(self, n_patterns: int) -> None:
        """Make room for pattern ids below ``n_patterns``."""
        if n_patterns > self._cap:
            self._grow(n_patterns)
        while len(self.top) < n_patterns:
            self.top.append([])
            self.example.append(None)
            self.cold_example.append(None)
            self.nottl_example.append(None)

    # -- accumulate ---------------------------------------------------------------------------------------
    def add_batch(self, pids: np.ndarray, keys: list[builtins.bytes], probe: np.ndarray) -> None:
        """Add one probed batch. ``probe``: int64 [N, 4] = type code, MEMORY USAGE, PTTL, idle (or freq)."""
        if len(keys) == 0:
            return
        tcode, mem, pttl, idle = probe[:, 0], probe[:, 1], probe[:, 2], probe[:, 3]
        alive = (tcode >= 0) & (mem >= 0) & (pttl != -2)
        n_gone = int(len(keys) - alive.sum())
        if n_gone:
            self.keys_vanished += n_gone
            idx = np.flatnonzero(alive)
            keys = [keys[i] for i in idx]
            pids, tcode, mem, pttl, idle = pids[idx], tcode[idx], mem[idx], pttl[idx], idle[idx]
            if len(keys) == 0:
                return
        pids = self._alias[pids]
        nottl = pttl == -1
        if self.idle_metric == "freq":
            cold = nottl & (idle >= 0) & (idle <= self.cold_after)
        else:
            cold = nottl & (idle >= self.cold_after)
        coll = COLLECTIONS[np.clip(tcode, 0, len(TYPES) - 1)]
        np.add.at(self.keys, pids, 1)
        np.add.at(self.bytes, pids, mem)
        np.maximum.at(self.bytes_max, pids, mem)
        np.maximum.at(self.idle_max, pids, idle)
        if nottl.any():
            np.add.at(self.nottl_keys, pids[nottl], 1)
            np.add.at(self.nottl_bytes, pids[nottl], mem[nottl])
        if cold.any():
            np.add.at(self.cold_keys, pids[cold], 1)
            np.add.at(self.cold_bytes, pids[cold], mem[cold])
        if coll.any():
            np.add.at(self.coll_keys, pids[coll], 1)
            np.add.at(self.coll_bytes, pids[coll], mem[coll])
        ttl_b = np.where(nottl, 0, 1 + np.searchsorted(_TTL_EDGES, pttl, side="right"))
        _count_into(self.types, pids, np.clip(tcode, 0, len(TYPES) - 1))
        _count_into(self.ttl, pids, ttl_b)
        _count_into(self.mem_hist, pids, bucket_of(mem))
        known = idle >= 0  # -1: unknown (an RDB written without an LRU/LFU policy, OBJECT refused)
        if known.all():
            _count_into(self.idle_hist, pids, bucket_of(idle))
        elif known.any():
            _count_into(self.idle_hist, pids[known], bucket_of(idle[known]))
        self._note_keys(pids, keys, tcode, mem, pttl, idle, cold)
        if nottl.any():
            _first_of_each(self.nottl_example, pids, keys, nottl)

    def _note_keys(self, pids: np.ndarray, keys: list[builtins.bytes], tcode: np.ndarray, mem: np.ndarray,
                   pttl: np.ndarray, idle: np.ndarray, cold: np.ndarray) -> None:
        """Examples and top keys: only the few keys that beat a pattern's current K-th largest."""
        topmin = self.topmin
        cand = np.flatnonzero(mem > topmin[pids])
        for i in cand.tolist():
            pid = int(pids[i])
            heap = self.top[pid]
            item = (int(mem[i]), keys[i], int(tcode[i]), int(pttl[i]), int(idle[i]))
            if len(heap) < TOP_K:
                heapq.heappush(heap, item)
            elif item[0] > heap[0][0]:
                heapq.heapreplace(heap, item)
            if len(heap) >= TOP_K:
                topmin[pid] = heap[0][0]
            if self.example[pid] is None:
                self.example[pid] = keys[i]
        if cold.any():
            _first_of_each(self.cold_example, pids, keys, cold)

    def merge(self, src: int, dst: int) -> None:
        """Fold pattern ``src`` into ``dst`` (the miner collapsed them); later batches alias src → dst."""
        self.ensure(max(src, dst) + 1)
        for name in self._SCALARS:
            arr = getattr(self, name)
            if name in ("bytes_max", "idle_max"):
                arr[dst] = max(arr[dst], arr[src])
            elif name != "topmin":
                arr[dst] += arr[src]
            arr[src] = -1 if name in ("topmin", "idle_max") else 0
        for name in ("types", "ttl", "mem_hist", "idle_hist"):
            arr2 = getattr(self, name)
            arr2[dst] += arr2[src]
            arr2[src] = 0
        merged = self.top[dst] + self.top[src]
        self.top[dst] = heapq.nlargest(TOP_K, merged)
        heapq.heapify(self.top[dst])
        self.top[src] = []
        self.topmin[dst] = self.top[dst][0][0] if len(self.top[dst]) >= TOP_K else -1
        for examples in (self.example, self.cold_example, self.nottl_example):
            if examples[dst] is None:
                examples[dst] = examples[src]
            examples[src] = None
        self._alias[self._alias == src] = dst

    # -- read out -----------------------------------------------------------------------------------------
    def row(self, pid: int) -> dict[str, Any]:
        """The statistics of one pattern as plain numbers (key names still bytes; the result decodes them)."""
        n = int(self.keys[pid])
        ttl = {name: int(c) for (name, _), c in zip(TTL_BUCKETS, self.ttl[pid])}
        idle_name = "idle_s" if self.idle_metric == "idletime" else "lfu_freq"
        imax = int(self.idle_max[pid])  # -1: no key of the pattern had a known idle time (or LFU counter)
        return {
            "keys": n,
            "bytes": int(self.bytes[pid]),
            "bytes_p50": quantile(self.mem_hist[pid], 0.5, int(self.bytes_max[pid])),
            "bytes_max": int(self.bytes_max[pid]),
            "no_ttl_keys": int(self.nottl_keys[pid]),
            "no_ttl_bytes": int(self.nottl_bytes[pid]),
            "cold_keys": int(self.cold_keys[pid]),
            "cold_bytes": int(self.cold_bytes[pid]),
            "collection_keys": int(self.coll_keys[pid]),
            "collection_bytes": int(self.coll_bytes[pid]),
            "ttl": ttl,
            idle_name: {
                "p50": quantile(self.idle_hist[pid], 0.5, imax),
                "p90": quantile(self.idle_hist[pid], 0.9, imax),
                "max": imax if n and imax >= 0 else None,
            },
            **({"idle_buckets": idle_buckets(self.idle_hist[pid])} if self.idle_metric == "idletime" and imax >= 0
               else {}),
            "types": {name: int(c) for name, c in zip(TYPES, self.types[pid]) if c},
            "top_keys": [
                {"key": k, "bytes": b, "type": TYPES[t] if 0 <= t < len(TYPES) else "other",
                 "ttl_ms": p if p >= 0 else None, idle_name: i if i >= 0 else None}
                for b, k, t, p, i in sorted(self.top[pid], reverse=True)
            ],
            "example_key": self.example[pid],
            "example_cold_key": self.cold_example[pid],
            "example_no_ttl_key": self.nottl_example[pid],
        }

    def live_ids(self) -> list[int]:
        return [pid for pid in range(len(self.top)) if self.keys[pid] > 0]


def _first_of_each(examples: list[builtins.bytes | None], pids: np.ndarray, keys: list[builtins.bytes],
                   mask: np.ndarray) -> None:
    """Give each pattern among ``pids[mask]`` that has no example yet its first key of the batch (one
    Python step per pattern, not per key)."""
    idx = np.flatnonzero(mask)
    uniq, first = np.unique(pids[idx], return_index=True)
    for pid, i in zip(uniq.tolist(), first.tolist()):
        if examples[pid] is None:
            examples[pid] = keys[int(idx[i])]
