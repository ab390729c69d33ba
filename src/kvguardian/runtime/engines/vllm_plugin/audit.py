"""The checks of vLLM's own KV cache manager, run inside its engine-core process (vLLM 0.32's v1 core).

At step boundaries, ref counts, block tables, the free queue and the scheduler's live requests are checked
against each other (no record checks itself): ref-count drift (KVG203), over-frees (KVG201), lost frees
(KVG204), conservation (KVG206) and cross-``cache_salt`` hits (KVG205). Full audits are rate-limited by a
``duty`` fraction while busy and run from the reporting thread when idle; evidence is bounded, and nothing is
ever changed. Invariants and cost: docs/design/engines.md.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from kvguardian.core.findings import Finding, Severity
from kvguardian.runtime.engines.board import FindingBoard
from kvguardian.runtime.engines.kv_events import salt_digest

__all__ = ["VllmPoolAudit", "namespace_of"]

_SHOW = 16  # blocks named in one finding's evidence
_MAX_REQUEST_FINDINGS = 256  # requests with a lost free that get a finding each (the rest are counted)
_FINISHED_MEMORY = 4096  # finished request ids remembered with their status (for naming lost frees)


def namespace_of(request: Any) -> str:
    """The request's prefix-cache namespace: "" unsalted, else a digest of its ``cache_salt``."""
    salt = getattr(request, "cache_salt", None)
    return salt_digest(salt) if isinstance(salt, str) and salt else ""


def _blocks_evidence(blocks: Sequence[Any]) -> dict[str, Any]:
    """The first blocks' ids and ref counts, and how many there are (the evidence of a block finding)."""
    return {"blocks": [b.block_id for b in blocks[:_SHOW]], "ref_counts": [b.ref_cnt for b in blocks[:_SHOW]],
            "num_blocks": len(blocks)}


def _status(request: Any) -> str:
    status = getattr(request, "status", None)
    return getattr(status, "name", None) or str(status)


class VllmPoolAudit:
    """Checks one scheduler's KV cache manager. Fed by the hooks (`kvguardian.runtime.engines.vllm_plugin.hooks`)
    from the engine thread; `summary` and `metrics` may be read from other threads."""

    def __init__(self, scheduler: Any, board: FindingBoard | None = None, *, duty: float = 0.005,
                 min_interval: float = 1.0) -> None:
        self._sched = weakref.ref(scheduler)
        self.board = board if board is not None else FindingBoard()
        self.duty = duty
        self.min_interval = min_interval
        self._ns_by_block: dict[int, tuple[Any, str]] = {}  # block id -> (its hash then, namespace written in)
        self._finished: OrderedDict[str, str] = OrderedDict()  # request id -> status when it was freed
        self._next_audit = 0.0
        self._dirty = True  # something changed since the last full audit
        self.audits = 0
        self.audit_seconds = 0.0
        self.last_audit_seconds = 0.0
        self.last_audit_time: float | None = None  # unix time
        self.requests_finished = 0
        self.double_frees = 0
        self.cross_namespace_hits = 0
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found cached
        self.evictions = 0
        self.lost_requests: set[str] = set()  # requests whose table outlived them, as of the last check
        self.metrics: dict[str, float] = {}  # the pool by state, as of the last full audit

    # ------------------------------------------------------------------ access to vLLM's structures
    def scheduler(self) -> Any:
        sched = self._sched()
        if sched is None:
            raise RuntimeError("the audited scheduler is gone")
        return sched

    def _parts(self) -> tuple[Any, Sequence[Any], dict[str, Any]]:
        sched = self.scheduler()
        kvm = sched.kv_cache_manager
        return kvm.block_pool, kvm.coordinator.single_type_managers, sched.requests

    # ------------------------------------------------------------------ per-call checks (engine thread)
    def after_free_request(self, request: Any, now: float) -> None:
        """The scheduler freed a finished request (``Scheduler._free_blocks``): it must hold no table now."""
        self._dirty = True
        self.requests_finished += 1
        rid = request.request_id
        self._finished[rid] = _status(request)
        self._finished.move_to_end(rid)
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)
        _, managers, requests = self._parts()
        if rid in requests:
            return  # still live (its free is delayed by a KV connector): judged when it is removed
        blocks = [b for m in managers for b in m.req_to_blocks.get(rid, ()) if not b.is_null]
        if blocks:
            self._lost_free(rid, blocks, now, when="when the scheduler freed it")

    def before_free_blocks(self, pool: Any, blocks: list[Any], now: float) -> None:
        """``BlockPool.free_blocks`` is about to release ``blocks``: none more often than it is referenced."""
        self._dirty = True
        if len(set(map(id, blocks))) == len(blocks):  # the usual case: each block once
            bad = [b for b in blocks if b.ref_cnt <= 0 and not b.is_null and (b.pool is None or b.pool is pool)]
            if not bad:
                return
        counts = Counter(map(id, blocks))  # KVCacheBlock compares by value and is unhashable: count by identity
        bad = [b for b in {id(b): b for b in blocks}.values()
               if not b.is_null and (b.pool is None or b.pool is pool) and counts[id(b)] > b.ref_cnt]
        if not bad:
            return
        self.double_frees += len(bad)
        self.board.raise_(("KVG201", "free"), Finding(
            id="KVG201",
            severity=Severity.ERROR,
            message=(f"vLLM freed {len(bad)} KV block(s) more times than they were referenced (block "
                     f"{bad[0].block_id}: ref count {bad[0].ref_cnt}, freed {counts[id(bad[0])]}x in one call); "
                     f"{self.double_frees} such block free(s) so far"),
            evidence={**_blocks_evidence(bad), "double_frees_total": self.double_frees},
        ), now)

    def after_cache_blocks(self, request: Any, blocks: Sequence[Any], start: int, stop: int) -> None:
        """``cache_full_blocks`` gave ``blocks[start:stop]`` their prefix hashes: remember whose KV they hold."""
        ns = namespace_of(request)
        table = self._ns_by_block
        for b in blocks[start:stop]:
            h = b._block_hash  # noqa: SLF001 - vLLM's field under its block_hash property; read per cached block
            if h is not None:  # the null block never gets one
                table[b.block_id] = (h, ns)

    def after_lookup(self, request: Any, result: Any, now: float) -> None:
        """``get_computed_blocks`` returned prefix-cache hits for ``request``: all of its own namespace."""
        hit_blocks, hit_tokens = result[0], result[1]
        self.prefix_queries += int(getattr(request, "num_tokens", 0) or 0)
        self.prefix_hits += int(hit_tokens or 0)
        if not hit_tokens:
            return
        ns = namespace_of(request)
        foreign = [b for group in hit_blocks.blocks for b in group if self._foreign(b, ns)]
        if foreign:
            self.cross_namespace_hits += 1
            self._cross_namespace(request.request_id, ns, foreign, now, how="a prefix-cache hit gave it")

    def _foreign(self, block: Any, ns: str) -> bool:
        rec = self._ns_by_block.get(block.block_id)
        return rec is not None and rec[0] == block.block_hash and rec[1] != ns

    def before_new_blocks(self, pool: Any, n: int) -> None:
        """``get_new_blocks(n)`` takes the first ``n`` blocks of the free queue: those with a hash are evicted."""
        queue = pool.free_block_queue
        if n > queue.num_free_blocks:
            return  # vLLM refuses the allocation: nothing is taken
        node, tail = queue.fake_free_list_head.next_free_block, queue.fake_free_list_tail
        evicted = 0
        for _ in range(n):
            if node is None or node is tail:
                break
            if node.block_hash is not None:
                evicted += 1
            node = node.next_free_block
        self.evictions += evicted

    def after_reset(self) -> None:
        """The prefix cache was reset: no block carries a hash any more."""
        self._ns_by_block.clear()
        self._dirty = True

    def note_change(self) -> None:
        self._dirty = True

    # ------------------------------------------------------------------ the full audit
    @property
    def dirty(self) -> bool:
        """Whether anything changed since the last full audit."""
        return self._dirty

    def maybe_audit(self, now: float) -> bool:
        """Audit now if the duty budget allows (called by the engine thread after each step)."""
        if now < self._next_audit:
            return False
        self.audit(now)
        return True

    def audit(self, now: float) -> None:
        """Every invariant at once; raises and resolves findings on the board."""
        t0 = time.perf_counter()
        pool, managers, requests = self._parts()
        refs, live_tables, orphans = self._references(pool, managers, requests)
        self._check_orphans(orphans, now)
        self._check_counts(pool, refs, now)
        self._check_shared(live_tables, requests, now)
        self.metrics = self._pool_metrics(pool, live_tables, requests, orphans)
        cost = time.perf_counter() - t0
        self._dirty = False
        self.audits += 1
        self.audit_seconds += cost
        self.last_audit_seconds = cost
        self.last_audit_time = time.time()
        self._next_audit = now + max(self.min_interval, cost / self.duty if self.duty > 0 else 0.0)

    def _references(self, pool: Any, managers: Sequence[Any], requests: dict[str, Any],
                    ) -> tuple[Counter[int], dict[str, list[Any]], dict[str, list[Any]]]:
        """References per block id, the live tables and the tables of requests that are gone."""
        refs: Counter[int] = Counter()
        live: dict[str, list[Any]] = {}
        orphans: dict[str, list[Any]] = {}
        for m in managers:
            for rid, table in list(m.req_to_blocks.items()):
                held = [b for b in table if not b.is_null and (b.pool is None or b.pool is pool)]
                refs.update(b.block_id for b in held)
                (live if rid in requests else orphans).setdefault(rid, []).extend(held)
        for _fence, blocks in getattr(self.scheduler(), "deferred_frees", ()):
            refs.update(b.block_id for b in blocks if not b.is_null and (b.pool is None or b.pool is pool))
        return refs, live, orphans

    def _check_orphans(self, orphans: dict[str, list[Any]], now: float) -> None:
        for rid in self.lost_requests - set(orphans):
            self.board.resolve(("KVG204", rid), now)
        for rid, blocks in list(orphans.items())[:_MAX_REQUEST_FINDINGS]:
            if blocks and not self.board.is_active(("KVG204", rid)):  # keep the finding of the free itself
                self._lost_free(rid, blocks, now, when="found by a full audit")
        self.lost_requests = {rid for rid, blocks in orphans.items() if blocks}

    def _lost_free(self, rid: str, blocks: list[Any], now: float, *, when: str) -> None:
        status = self._finished.get(rid, "unknown (not freed through the scheduler)")
        self.lost_requests.add(rid)
        ids = [b.block_id for b in blocks]
        self.board.raise_(("KVG204", rid), Finding(
            id="KVG204",
            severity=Severity.ERROR,
            message=(f"vLLM request {rid!r} ({status}) is no longer live but still holds {len(ids)} KV block(s) "
                     f"({when}): blocks {ids[:_SHOW]}{' …' if len(ids) > _SHOW else ''} are never freed"),
            evidence={"request_id": rid, "status": status, **_blocks_evidence(blocks)},
        ), now)

    def _check_counts(self, pool: Any, refs: Counter[int], now: float) -> None:
        drift, negative, zero = [], [], 0
        for b in pool.blocks:
            if b.is_null:
                continue
            rc = b.ref_cnt
            if rc < 0:
                negative.append(b)
            elif rc == 0:
                zero += 1
            if rc != refs.get(b.block_id, 0):
                drift.append(b)
        self._finding_if(("KVG203", "pool"), bool(drift), now, lambda: Finding(
            id="KVG203",
            severity=Severity.ERROR,
            message=(f"{len(drift)} vLLM KV block(s) have a ref count that differs from the number of live block "
                     f"tables (and deferred frees) listing them: block {drift[0].block_id} has ref count "
                     f"{drift[0].ref_cnt}, listed {refs.get(drift[0].block_id, 0)}x"),
            evidence={**_blocks_evidence(drift), "listed": [refs.get(b.block_id, 0) for b in drift[:_SHOW]]},
        ))
        self._finding_if(("KVG201", "pool"), bool(negative), now, lambda: Finding(
            id="KVG201",
            severity=Severity.ERROR,
            message=(f"{len(negative)} vLLM KV block(s) have a negative ref count (freed more often than "
                     f"referenced): block {negative[0].block_id} at {negative[0].ref_cnt}"),
            evidence={"blocks": [b.block_id for b in negative[:_SHOW]]},
        ))
        self._check_free_queue(pool, zero, now)

    def _check_free_queue(self, pool: Any, unreferenced: int, now: float) -> None:
        queue = pool.free_block_queue
        counted = queue.num_free_blocks
        walked, bad, node, tail = 0, [], queue.fake_free_list_head.next_free_block, queue.fake_free_list_tail
        limit = len(pool.blocks) + 1
        while node is not None and node is not tail and walked <= limit:
            walked += 1
            if node.ref_cnt != 0 or node.is_null:
                bad.append(node)
            node = node.next_free_block
        usable = len(pool.blocks) - 1
        referenced = usable - unreferenced
        ok = counted == unreferenced == walked and not bad
        self._finding_if(("KVG206", "pool"), not ok, now, lambda: Finding(
            id="KVG206",
            severity=Severity.ERROR,
            message=(f"vLLM's block pool does not add up: the free queue counts {counted} block(s) and links "
                     f"{walked}, but {unreferenced} of the {usable} usable blocks are unreferenced "
                     f"({referenced} referenced); {len(bad)} queued block(s) are referenced"),
            evidence={"queue_count": counted, "queue_linked": walked, "unreferenced": unreferenced,
                      "referenced": referenced, "usable_blocks": usable,
                      "referenced_in_queue": [b.block_id for b in bad[:_SHOW]]},
        ))

    def _check_shared(self, live: dict[str, list[Any]], requests: dict[str, Any], now: float) -> None:
        owner: dict[int, tuple[str, str]] = {}  # block id -> (first live request listing it, its namespace)
        for rid, blocks in live.items():
            ns = namespace_of(requests[rid])
            foreign = []
            for b in blocks:
                first = owner.setdefault(b.block_id, (rid, ns))
                if first[1] != ns or self._foreign(b, ns):
                    foreign.append(b)
            if foreign and not self.board.is_active(("KVG205", rid)):  # keep the finding of the hit itself
                self._cross_namespace(rid, ns, foreign, now, how="it shares")

    def _cross_namespace(self, rid: str, ns: str, blocks: list[Any], now: float, *, how: str) -> None:
        written = sorted({self._ns_by_block.get(b.block_id, (None, "?"))[1] or "unsalted" for b in blocks})
        self.board.raise_(("KVG205", rid), Finding(
            id="KVG205",
            severity=Severity.ERROR,
            message=(f"vLLM request {rid!r} (namespace {ns or 'unsalted'}): {how} {len(blocks)} KV block(s) "
                     f"written under another cache_salt namespace ({', '.join(written)}): blocks "
                     f"{[b.block_id for b in blocks[:_SHOW]]}"),
            evidence={"request_id": rid, "namespace": ns or "unsalted", "written_in": written,
                      "blocks": [b.block_id for b in blocks[:_SHOW]], "num_blocks": len(blocks)},
        ), now)

    def _finding_if(self, key: tuple[str, str], condition: bool, now: float, make: Any) -> None:
        if condition:
            self.board.raise_(key, make(), now)
        else:
            self.board.resolve(key, now)

    # ------------------------------------------------------------------ reading (any thread)
    def _pool_metrics(self, pool: Any, live: dict[str, list[Any]], requests: dict[str, Any],
                      orphans: dict[str, list[Any]]) -> dict[str, float]:
        free = cached = referenced = 0
        for b in pool.blocks:
            if b.is_null:
                continue
            if b.ref_cnt > 0:
                referenced += 1
            elif b.block_hash is None:
                free += 1
            else:
                cached += 1
        usable = max(len(pool.blocks) - 1, 1)
        lost = sum(len(v) for v in orphans.values())
        block_size = int(getattr(self.scheduler(), "block_size", 0) or 0)
        slots = tokens = 0
        if block_size:
            for rid, blocks in live.items():
                n = len(blocks) * block_size
                slots += n
                tokens += min(n, int(getattr(requests[rid], "num_computed_tokens", 0) or 0))
        return {
            "blocks_total": usable, "blocks_free": free, "blocks_cached": cached, "blocks_referenced": referenced,
            "blocks_lost": lost, "residency_ratio": (cached + lost) / usable,
            "fragmentation_ratio": (slots - tokens) / slots if slots else 0.0,
            "prefix_queries_total": self.prefix_queries, "prefix_hits_total": self.prefix_hits,
            "prefix_hit_rate": self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0,
            "evictions_total": self.evictions, "requests_live": len(requests),
        }

    def summary(self) -> dict[str, Any]:
        return {
            "audits": self.audits,
            "audit_seconds_total": round(self.audit_seconds, 6),
            "last_audit_seconds": round(self.last_audit_seconds, 6),
            "last_audit_time": self.last_audit_time,
            "requests_finished": self.requests_finished,
            "lost_free_requests": sorted(self.lost_requests)[:_SHOW],
            "double_frees": self.double_frees,
            "cross_namespace_hits": self.cross_namespace_hits,
            "pool": dict(self.metrics),
            "findings_dropped": self.board.dropped,
        }

