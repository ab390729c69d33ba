"""Audit the prefix-cache index that vLLM's KV events describe: growth without removal (KVG208), cache-salt
namespaces that split one prefix into many copies (KVG208), and clears after a sleep/reload (KVG105).

The events show prefix-cache membership only (a lost free is the metrics' idle check), but the index can
never exceed the pool. Since vLLM publishes only when it steps, the stale-index check waits for the first
batch after a wake. The auditor's own index is bounded. What the events can and cannot show:
docs/design/engines.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

from kvguardian.core.findings import Finding, Severity
from kvguardian.runtime.engines.board import FindingBoard
from kvguardian.runtime.engines.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

__all__ = ["ANOMALIES", "PrefixIndexAudit"]

#: Events that decoded but did not fit (label values of kvguardian_watch_kv_event_anomalies_total).
ANOMALIES = ("removal_of_unknown_hash", "duplicate_store", "duplicate_batch", "index_full", "too_many_media")

_GPU = "GPU"
_MAX_MEDIA = 16  # distinct (medium, group) pairs kept; a publisher inventing media cannot grow our labels


class PrefixIndexAudit:
    """The index rebuilt from events, and the checks on it. Single-threaded: the watch loop feeds it."""

    def __init__(
        self,
        board: FindingBoard,
        *,
        capacity_blocks: int | None = None,
        index_limit: int = 1_000_000,
        max_salts_per_prefix: int = 64,
        prefix_limit: int = 100_000,
        grace: float = 60.0,
    ) -> None:
        self.board = board
        self.grace = grace
        self.capacity_blocks = capacity_blocks  # GPU pool size in blocks (num_gpu_blocks), when known
        self.index_limit = index_limit
        self.max_salts_per_prefix = max_salts_per_prefix
        self.prefix_limit = prefix_limit
        self._index: dict[tuple[str, int], dict[Hashable, int]] = {}  # (medium, group) -> hash -> namespace id
        self._size = 0
        self._ns_ids: dict[str, int] = {"": 0}  # "" = unsalted; "?" = unknown (parent stored before we joined)
        self._ns_ids["?"] = 1
        self._roots: dict[bytes, set[int]] = {}  # digest of a prompt's first block -> namespaces storing it
        self._ns_blocks: Counter[int] = Counter()  # namespace id -> blocks of it in the index
        self._worst_split = 0  # most namespaces any one prefix is stored under
        self._split_prefixes = 0  # prefixes stored under max_salts_per_prefix namespaces or more
        self.events: Counter[str] = Counter()  # by event type (BlockStored, BlockRemoved, AllBlocksCleared)
        self.anomalies: Counter[str] = Counter()
        self.clears = 0
        self.restarts = 0  # publisher restarts seen (the index was reset, no event said so)
        self.reannounced = 0  # blocks announced again while indexed (kv_cache_report_mode "full")
        self.incomplete = False  # events were lost since the last clear: the index may be wrong
        self._sleep_pending: tuple[float, int] | None = None  # (time the engine slept, blocks then), until a clear
        self._slept_wall: float | None = None  # unix time the sleep was seen, to tell late batches by their ts
        self._woke_at: float | None = None  # the engine woke with blocks uncleared: judged at the next batch

    # ------------------------------------------------------------------ feeding
    def apply(self, event: KVEvent, now: float) -> None:
        """Apply one event to the index (call `evaluate` after a batch)."""
        if isinstance(event, BlockStored):
            self.events["BlockStored"] += 1
            self._store(event)
        elif isinstance(event, BlockRemoved):
            self.events["BlockRemoved"] += 1
            table = self._index.get((event.medium, event.group_idx))
            for h in event.block_hashes:
                ns = table.pop(h, None) if table is not None else None
                if ns is not None:
                    self._size -= 1
                    self._ns_blocks[ns] -= 1
                else:  # stored before we subscribed, or announced in a lost batch: ignored, counted
                    self.anomalies["removal_of_unknown_hash"] += 1
        elif isinstance(event, AllBlocksCleared):
            self.events["AllBlocksCleared"] += 1
            self.reset(now)

    def _store(self, ev: BlockStored) -> None:
        key = (ev.medium, ev.group_idx)
        table = self._index.get(key)
        if table is None:
            if len(self._index) >= _MAX_MEDIA:
                self.anomalies["too_many_media"] += 1
                return
            table = self._index[key] = {}
        if ev.parent_block_hash is None:
            ns = self._namespace(ev.salt_digest or "") if ev.has_extra_keys else 1
        else:
            ns = table.get(ev.parent_block_hash, 1)  # a chain inherits its first block's namespace
        if ev.root_token_digest is not None:
            self._note_root(ev.root_token_digest, ns)
        if ev.block_hashes and all(h in table for h in ev.block_hashes):
            self.reannounced += len(ev.block_hashes)  # reused blocks announced again ("full" report mode)
            return
        for h in ev.block_hashes:
            if h in table:
                self.anomalies["duplicate_store"] += 1  # at-least-once delivery: deduplicated
                continue
            if self._size >= self.index_limit:
                self.anomalies["index_full"] += 1
                continue
            table[h] = ns
            self._size += 1
            self._ns_blocks[ns] += 1

    def _namespace(self, digest: str) -> int:
        ns = self._ns_ids.get(digest)
        if ns is None:
            if len(self._ns_ids) >= self.prefix_limit:
                return 1  # too many to tell apart: unknown
            ns = self._ns_ids[digest] = len(self._ns_ids)
        return ns

    def _note_root(self, digest: bytes, ns: int) -> None:
        spaces = self._roots.get(digest)
        if spaces is None:
            if len(self._roots) >= self.prefix_limit:
                return
            spaces = self._roots[digest] = set()
        if ns in spaces or len(spaces) >= self.max_salts_per_prefix:
            return
        spaces.add(ns)
        self._worst_split = max(self._worst_split, len(spaces))
        if len(spaces) == self.max_salts_per_prefix:
            self._split_prefixes += 1

    def reset(self, now: float, *, restart: bool = False) -> None:
        """Everything was dropped (AllBlocksCleared) or the publisher restarted: start a fresh index."""
        self._index.clear()
        self._size = 0
        self._roots.clear()
        self._ns_blocks.clear()
        self._worst_split = self._split_prefixes = 0
        self.clears += 1
        self.incomplete = False
        self._sleep_pending = self._woke_at = self._slept_wall = None
        for kind in ("KVG105", "KVG209"):
            self.board.resolve((kind, "prefix-index"), now)
        if restart:
            self.restarts += 1

    # ------------------------------------------------------------------ reload (sleep/wake) tracking
    def note_sleep(self, now: float, wall: float | None = None) -> None:
        """The engine went to sleep (its KV cache is discarded): the index must be cleared before it is used.
        ``wall``: the unix time the sleep was seen (after the scrape that showed it), for `evaluate`."""
        if self._size and self._sleep_pending is None:
            self._sleep_pending = (now, self._size)
            self._slept_wall = wall

    def note_wake(self, now: float) -> None:
        """The engine woke up. Its clear is published at its next step, so judge at the next batch."""
        if self._sleep_pending is not None and self._size:
            self._woke_at = now

    def check_wake(self, now: float, *, engine_served: bool) -> None:
        """Judge a wake that no batch followed: only once the engine served requests for ``grace`` seconds."""
        if self._woke_at is not None and engine_served and now - self._woke_at >= self.grace:
            self._judge_wake(now, "the engine served requests since waking, yet no KV event batch arrived")

    def _judge_wake(self, now: float, why: str) -> None:
        woke_at, self._woke_at = self._woke_at, None
        if self._sleep_pending is None or not self._size or woke_at is None:
            return
        slept_at, blocks = self._sleep_pending
        self.board.raise_(("KVG105", "prefix-index"), Finding(
            id="KVG105",
            severity=Severity.WARNING,
            message=(
                f"{self._size} prefix-cache blocks announced before the engine slept were never cleared "
                f"({why}; no AllBlocksCleared): sleep discards the KV cache, so a prefix hit on them after "
                "wake-up would serve KV the engine no longer holds"
            ),
            evidence={"blocks_in_index": self._size, "blocks_when_sleeping": blocks,
                      "seconds_asleep": round(woke_at - slept_at, 3), "clears_seen": self.clears},
            fix=("vLLM publishes AllBlocksCleared at the engine's first step after /sleep or /reset_prefix_cache: "
                 "check that the sleep or weight reload resets the prefix cache (reset_prefix_cache returns true "
                 "only when no request holds blocks) and that no event batch was lost (KVG209)"),
        ), now)

    # ------------------------------------------------------------------ checks
    def evaluate(self, now: float, batch_ts: float | None = None) -> None:
        """Raise or resolve KVG208 from the index as it is now (after each batch; O(media), not O(index)).
        ``batch_ts``: the batch's own timestamp (the publisher's unix time), when known."""
        self._check_capacity(now)
        self._check_salts(now)
        if self._woke_at is not None and not self._stamped_before_sleep(batch_ts):
            # the first batch after a wake: its clear, if any, was applied already
            self._judge_wake(now, "the first event batch after wake-up carried none")

    def _stamped_before_sleep(self, batch_ts: float | None) -> bool:
        """A batch the engine published before it slept, arriving after the metrics showed the wake: vLLM
        publishes from a thread, and under load its last batches before a sleep came after the wake was seen
        (a false KVG105 on a clean server). No step runs while asleep, so a batch stamped before the sleep was
        seen is not the first after the wake. (Server and watcher clocks are assumed to agree within the sleep.)"""
        return batch_ts is not None and self._slept_wall is not None and batch_ts < self._slept_wall

    def _check_capacity(self, now: float) -> None:
        gpu = sum(len(t) for (medium, _), t in self._index.items() if medium.upper() == _GPU)
        cap = self.capacity_blocks - 1 if self.capacity_blocks else None  # the null block is never cached
        key = ("KVG208", "capacity")
        if cap is not None and gpu > cap:
            proven = not self.incomplete
            self.board.raise_(key, Finding(
                id="KVG208",
                severity=Severity.ERROR if proven else Severity.WARNING,
                message=(
                    f"the prefix-cache index rebuilt from KV events holds {gpu} GPU blocks, more than the pool's "
                    f"{cap} cacheable blocks: blocks are stored and their removals never published"
                    + ("" if proven else " (events were lost, so this may be our gap)")
                ),
                evidence={**self.summary(), "gpu_blocks_in_index": gpu, "cacheable_blocks": cap},
            ), now)
        elif self._size >= self.index_limit:
            self.board.raise_(key, Finding(
                id="KVG208",
                severity=Severity.WARNING,
                message=(f"the prefix-cache index reached the audit's limit of {self.index_limit} blocks without "
                         "removals keeping up; further blocks are counted, not indexed"),
                evidence=self.summary(),
            ), now)
        else:
            self.board.resolve(key, now)

    def _check_salts(self, now: float) -> None:
        worst, split = self._worst_split, self._split_prefixes
        key = ("KVG208", "salts")
        if worst >= self.max_salts_per_prefix:
            self.board.raise_(key, Finding(
                id="KVG208",
                severity=Severity.WARNING,
                message=(
                    f"{split} prompt prefix(es) are cached under {worst}+ different cache salts: salts split one "
                    "prefix into as many copies, so the prefix index grows with every salt (per-request salts "
                    "defeat the prefix cache; per-tenant salts are the intended use)"
                ),
                evidence={**self.summary(), "max_namespaces_per_prefix": worst, "prefixes_split": split},
            ), now)
        else:
            self.board.resolve(key, now)

    def mark_incomplete(self) -> None:
        self.incomplete = True

    # ------------------------------------------------------------------ reading
    def size(self) -> int:
        return self._size

    def size_by_medium(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (medium, _), table in list(self._index.items()):  # list(): the exporter reads from another thread
            out[medium] += len(table)
        return dict(out)

    def namespaces(self) -> int:
        """Namespaces seen: the unsalted one plus each distinct salt (the 'unknown' marker excluded)."""
        return len(self._ns_ids) - 1

    def summary(self) -> dict[str, object]:
        return {
            "index_blocks": self._size,
            "index_blocks_by_medium": self.size_by_medium(),
            "namespaces_seen": self.namespaces(),
            "salted_blocks_in_index": sum(n for ns, n in self._ns_blocks.items() if ns >= 2),
            "blocks_of_unknown_namespace": self._ns_blocks.get(1, 0),
            "events": dict(self.events),
            "anomalies": dict(self.anomalies),
            "blocks_reannounced": self.reannounced,
            "clears": self.clears,
            "restarts": self.restarts,
            "incomplete": self.incomplete,
            "capacity_blocks": self.capacity_blocks,
        }
