"""The paged KV pool with ownership: preallocated K/V blocks bound to (request, tenant) block tables.

    pool = PagedKVPool(num_blocks=256, block_size=16, kv=KVSpec(num_layers=2, kv_heads=2, head_dim=16))
    pool.open("r-1", tenant="acme")
    slots = pool.append("r-1", prompt)                  # slots = block * block_size + offset
    pool.free("r-1")

High-level operations keep tables and ref counts in step; the raw ones (`allocate_blocks`, `share_blocks`,
`release_blocks`) trust the caller, as vLLM's ``BlockPool`` does. ``debug=True`` checks every operation
(`kvguardian.runtime.paged.debug`). Details: docs/design/paged.md.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Finding
from kvguardian.runtime.paged.block_pool import BlockPool, PoolExhausted
from kvguardian.runtime.paged.prefix import (
    EventStream,
    KVEvent,
    encode_extra_keys,
    extend_chain,
    lookup_chain,
    namespace_for,
    namespace_root,
)
from kvguardian.runtime.paged.raw_ops import RawBlockOps
from kvguardian.runtime.paged.records import BlockTable, KVSpec, TableState
from kvguardian.runtime.paged.remanence import Remanence

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from kvguardian.runtime.paged.debug import DebugChecker

__all__ = ["PagedKVPool", "PoolExhausted"]

_CLOSED_LIMIT = 4096


class PagedKVPool(RawBlockOps):
    """Fixed-size KV blocks with ref counts, an LRU free list, a tenant-salted prefix cache and
    per-request block tables.

    Args:
        num_blocks: blocks in the pool.
        block_size: token slots per block.
        kv: K/V tensor layout; None keeps only the bookkeeping and never imports torch.
        prefix_caching: register full blocks under chained, salted hashes and reuse them.
        debug: check every operation incrementally (findings in `faults`).
        on_fault: ``"record"`` (observe and proceed) or ``"raise"`` (`PoolFault` at the faulty operation).
        scrub: ``"on-tenant-change"``, ``"always"`` or ``"never"`` (`kvguardian.runtime.paged.remanence`).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        kv: KVSpec | None = None,
        *,
        prefix_caching: bool = True,
        debug: bool = False,
        on_fault: str = "record",
        event_capacity: int = 8192,
        fault_capacity: int = 1024,
        clock: Callable[[], float] = time.monotonic,
        scrub: str = "never",
    ) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise UsageError(f"block_size must be a positive int, got {block_size!r}")
        if on_fault not in ("record", "raise"):
            raise UsageError(f"on_fault must be 'record' or 'raise', got {on_fault!r}")
        self.block_size = block_size
        self.kv = kv
        self.prefix_caching = prefix_caching
        self.clock = clock
        self.events = EventStream(event_capacity, clock)
        self.blocks = BlockPool(num_blocks, events=self.events)
        self.num_blocks = num_blocks
        self.filled = np.zeros(num_blocks, dtype=np.int32)  # token slots assigned in each block
        self.ns_of = np.full(num_blocks, -1, dtype=np.int32)  # namespace code of each block's content
        self._mark = np.zeros(num_blocks, dtype=bool)  # scratch, all False between operations
        self._slot = np.zeros(num_blocks, dtype=np.int64)  # scratch for de-duplicating caller block ids
        self._tables: dict[str, BlockTable] = {}  # open and preempted tables by request id
        self._closed: OrderedDict[int, BlockTable] = OrderedDict()  # closed while holding blocks (lost frees)
        self.closed_forgotten = 0  # lost-free tables dropped from _closed past its bound
        self._ns_codes: dict[str, int] = {}
        self._roots: dict[str, bytes] = {}
        self._next_code = 0
        self.op_seq = 0  # operations so far; findings name the operation by this number
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache (vLLM counts tokens too)
        self.prefix_hits = 0  # of those, tokens served from cached blocks
        self.preemptions = 0
        self.cow_copies = 0
        self.k: list[Any] = []  # per layer: [num_blocks, block_size, kv_heads, head_dim]
        self.v: list[Any] = []
        self.block_bytes = 0
        if kv is not None:
            import torch

            dtype = getattr(torch, kv.dtype)
            shape = (num_blocks, block_size, kv.kv_heads, kv.head_dim)
            self.k = [torch.zeros(shape, dtype=dtype, device=kv.device) for _ in range(kv.num_layers)]
            self.v = [torch.zeros(shape, dtype=dtype, device=kv.device) for _ in range(kv.num_layers)]
            self.block_bytes = kv.block_bytes(block_size)
        self.events.block_bytes = self.block_bytes
        self.faults_count: Counter[str] = Counter()
        # optional observer, called with the number of blocks after each allocation (kvguardian.ops.oom samples there)
        self.on_allocate: Callable[[int], None] | None = None
        self._debug: DebugChecker | None = None  # the observer of every operation (debug mode)
        if debug:
            from kvguardian.runtime.paged.debug import DebugChecker

            self._debug = DebugChecker(self, capacity=fault_capacity, raise_on_fault=(on_fault == "raise"))
            self.blocks.queue.observer = self._debug
        self.remanence = Remanence(self, scrub, residue_check=debug) if scrub != "never" or debug else None

    def __repr__(self) -> str:
        return (f"<PagedKVPool {self.num_blocks}x{self.block_size} tables={len(self._tables)} "
                f"available={self.blocks.num_available}{' debug' if self.debug else ''}>")

    @property
    def debug(self) -> bool:
        return self._debug is not None

    # ------------------------------------------------------------------ tables
    def open(self, request_id: str, tenant: str, *, shared: str | None = None,
             extra_keys: Sequence[object] = ()) -> BlockTable:
        """Bind a new, empty block table to (``request_id``, ``tenant``).

        ``shared`` opts the request into a shared prefix namespace: its blocks are shared with every tenant
        that opts into the same name, and with nobody else.

        Raises:
            UsageError: the request id already has an open table.
        """
        return self._open(request_id, tenant, namespace_for(tenant, shared), encode_extra_keys(extra_keys))

    def _open(self, request_id: str, tenant: str, ns: str, extra: bytes) -> BlockTable:
        if not isinstance(request_id, str) or not request_id:
            raise UsageError(f"request id must be a non-empty string, got {request_id!r}")
        if request_id in self._tables:
            raise UsageError(f"request {request_id!r} already has a block table; fix: free or close it first")
        ns_code = self._ns_codes.setdefault(ns, len(self._ns_codes))
        root = self._roots.get(ns)
        if root is None:
            root = self._roots[ns] = namespace_root(ns)
        table = BlockTable(request_id, tenant, ns, self._next_code, ns_code, root, extra, self.clock())
        self._next_code += 1
        self._tables[request_id] = table
        if self._debug is not None:
            self._debug.on_open(table)
        return table

    def table(self, request_id: str) -> BlockTable:
        """The open (or preempted) table of ``request_id``.

        Raises:
            UsageError: no such table.
        """
        table = self._tables.get(request_id)
        if table is None:
            raise UsageError(f"request {request_id!r} has no open block table; fix: open() it first")
        return table

    def has_table(self, request_id: str) -> bool:
        return request_id in self._tables

    def tables(self) -> list[BlockTable]:
        return list(self._tables.values())

    def closed_tables(self) -> list[BlockTable]:
        """Tables closed while still holding blocks: their frees were lost."""
        return list(self._closed.values())

    @property
    def num_tables(self) -> int:
        """Open and preempted tables."""
        return len(self._tables)

    def namespace_name(self, code: int) -> str:
        """The prefix-cache namespace with integer ``code`` ("?" if unknown)."""
        for name, c in self._ns_codes.items():
            if c == code:
                return name
        return "?"

    def block_ids(self, request_id: str) -> np.ndarray:
        """A copy of the request's block ids, in token order."""
        return self.table(request_id).block_ids.copy()

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.blocks.num_available

    def blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """Blocks `append` would allocate for ``num_tokens`` more tokens (copy-on-write included)."""
        t = self.table(request_id)
        need = -(-(t.num_tokens + num_tokens) // self.block_size) - t.num_blocks
        if self._shared_partial_tail(t):
            need += 1
        return max(need, 0)

    # ------------------------------------------------------------------ high-level operations
    def probe_prefix(self, request_id: str, token_ids: Sequence[int]) -> int:
        """Tokens `match_prefix` would serve from the cache now, without taking or counting anything."""
        return len(self._lookup(self.table(request_id), token_ids)[0]) * self.block_size

    def admission_cost(self, request_id: str, token_ids: Sequence[int]) -> int:
        """Free-queue blocks that `match_prefix` + `append` of ``token_ids`` would take from the empty table:
        new blocks for the uncached part, plus cached hits that nobody references (they leave the queue)."""
        hits, _ = self._lookup(self.table(request_id), token_ids)
        idle_hits = int(np.count_nonzero(self.blocks.ref_counts(hits) == 0)) if hits else 0
        return -(-(len(token_ids) - len(hits) * self.block_size) // self.block_size) + idle_hits

    def match_prefix(self, request_id: str, token_ids: Sequence[int]) -> int:
        """Attach the longest cached prefix of ``token_ids`` (full blocks, same namespace) to the empty table.
        At least one token is left to compute. Returns the number of prompt tokens served from the cache."""
        t = self.table(request_id)
        if t.num_tokens or t.num_blocks:
            raise UsageError(f"match_prefix({request_id!r}) needs an empty table; it holds {t.num_blocks} blocks")
        self._begin("match_prefix", t)
        hits, hashes = self._lookup(t, token_ids)
        ids = np.asarray(hits, dtype=np.int32)
        if self.prefix_caching:
            self.prefix_queries += len(token_ids)
        if len(ids):
            if self._debug is not None:
                self._debug.pre_share(t, ids)
            self.blocks.touch(ids)
            self._table_add(t, ids)
            t.hashes.extend(hashes)
            t.num_tokens = len(ids) * self.block_size
            t.state = TableState.OPEN
            self.prefix_hits += t.num_tokens
            self.events.emit("hit", hashes, hits, owner=t.owner)
        self._end(ids)
        return len(ids) * self.block_size

    def _lookup(self, t: BlockTable, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        if not self.prefix_caching:
            return [], []
        return lookup_chain(self.blocks.by_hash, t.root, token_ids, self.block_size, t.extra)

    def append(self, request_id: str, token_ids: Sequence[int]) -> np.ndarray:
        """Assign K/V slots to ``token_ids`` (the next tokens of the request, in order), allocating blocks
        and copying a shared partial last block first (copy-on-write). Full blocks are registered in the
        prefix cache. Returns the slots (``block * block_size + offset``) as int64.

        Raises:
            PoolExhausted: not enough free or evictable blocks; nothing was changed.
        """
        t = self.table(request_id)
        n = len(token_ids)
        bs = self.block_size
        start = t.num_tokens
        cow = self._shared_partial_tail(t)
        need = -(-(start + n) // bs) - t.num_blocks
        if max(need, 0) + cow > self.blocks.num_available:
            raise PoolExhausted(
                f"request {request_id!r} needs {max(need, 0) + cow} blocks for {n} tokens, "
                f"{self.blocks.num_available} are free or evictable; fix: preempt a request or wait"
            )
        self._begin("append", t)
        touched = []
        if cow:
            touched.append(self._copy_on_write(t))
        if need > 0:
            new = np.array(self.blocks.get_new_blocks(need), dtype=np.int32)
            self._claim(t, new)
            self.ns_of[new] = t.ns_code
            self.filled[new] = 0
            self._table_add(t, new)
            touched.append(new)
        t.state = TableState.OPEN
        pos = np.arange(start, start + n, dtype=np.int64)
        live = t.block_ids
        slots = live[pos // bs].astype(np.int64) * bs + pos % bs
        if n:
            first, last = start // bs, (start + n - 1) // bs
            idx = np.arange(first, last + 1)
            self.filled[live[idx]] = np.minimum(start + n - idx * bs, bs)
        t.num_tokens = start + n
        if self._debug is not None:
            self._debug.assign_slots(t, slots)
        self._hash_new_blocks(t, token_ids)
        self._end(np.concatenate(touched) if touched else np.empty(0, dtype=np.int32))
        if self.on_allocate is not None and (need > 0 or cow):
            self.on_allocate(max(need, 0) + cow)
        return slots

    def fork(self, parent_id: str, child_id: str, *, tenant: str | None = None,
             shared: str | None = None) -> BlockTable:
        """A new table ``child_id`` sharing every block of ``parent_id`` (parallel sampling, beam search).
        The child belongs to the parent's tenant and namespace unless given; the first of the two to append
        into a shared, partially filled block copies it first."""
        p = self.table(parent_id)
        if tenant is None and shared is None:
            c = self._open(child_id, p.tenant, p.namespace, p.extra)
        else:
            child_tenant = tenant if tenant is not None else p.tenant
            c = self._open(child_id, child_tenant, namespace_for(child_tenant, shared), p.extra)
        self._begin("fork", c)
        ids = p.block_ids.copy()
        if self._debug is not None:
            self._debug.pre_share(c, ids, parent=p)
        self.blocks.touch(ids)
        self._table_add(c, ids)
        c.num_tokens = p.num_tokens
        c.hashes = list(p.hashes)
        c.tail_tokens = list(p.tail_tokens)
        self._end(ids)
        return c

    def free(self, request_id: str) -> int:
        """Release every block of the request (tail first) and close its table. Returns blocks released."""
        t, n = self._release_all("free", request_id)
        self._close(t)
        return n

    def preempt(self, request_id: str) -> int:
        """Release every block of the request to make room; the table stays open, empty, to recompute later."""
        t, n = self._release_all("preempt", request_id)
        t.state = TableState.PREEMPTED
        t.preemptions += 1
        self.preemptions += 1
        return n

    def close(self, request_id: str) -> None:
        """End the request's table. It must hold no block: a table closed with blocks is a lost free
        (KVG204), kept for the audit."""
        t = self.table(request_id)
        self._begin("close", t)
        if self._debug is not None:
            self._debug.pre_close(t)
        self._close(t)
        self._end(np.empty(0, dtype=np.int32))

    # ------------------------------------------------------------------ K/V access
    def write(self, request_id: str, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V ``[n, kv_heads, head_dim]`` of ``request_id`` at ``slots`` (int64 tensor) of ``layer``.
        In debug mode the writer must own every block it writes (its table, and no other, holds it)."""
        if self._debug is not None:
            t = self._tables.get(request_id)
            self._begin("write", t, layer=layer)
            self._debug.check_write(t, request_id, slots, layer)
            self._note_write(layer, slots)
        kv = self._kv()
        self.k[layer].view(-1, kv.kv_heads, kv.head_dim).index_copy_(0, slots, k)
        self.v[layer].view(-1, kv.kv_heads, kv.head_dim).index_copy_(0, slots, v)

    def gather(self, layer: int, block_ids: torch.Tensor, num_tokens: int, *,
               request_id: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[num_tokens, kv_heads, head_dim]`` of a sequence, read through its block table
        (``block_ids``: int64 tensor in token order). In debug mode, naming the reader (``request_id``) checks
        that every slot read was written by its block's owner since allocation (KVG211)."""
        if self._debug is not None and request_id is not None:
            self._check_read(request_id, layer, block_ids, num_tokens)
        kv = self._kv()
        k = self.k[layer].index_select(0, block_ids).view(-1, kv.kv_heads, kv.head_dim)[:num_tokens]
        v = self.v[layer].index_select(0, block_ids).view(-1, kv.kv_heads, kv.head_dim)[:num_tokens]
        return k, v

    # ------------------------------------------------------------------ prefix cache management
    def evict_cached(self, max_blocks: int | None = None) -> int:
        """Evict up to ``max_blocks`` unreferenced cached blocks, least recently used first."""
        return self.blocks.evict_cached(max_blocks)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (a "cleared" event); blocks in use stay in use."""
        return self.blocks.reset_prefix_cache()

    # ------------------------------------------------------------------ reading
    def take_events(self) -> list[KVEvent]:
        """Pop the buffered prefix-cache events (stored / removed / cleared / hit)."""
        return self.events.take()

    @property
    def faults(self) -> list[Finding]:
        """Findings of the debug checks so far (bounded; `faults_count` counts all of them)."""
        return [] if self._debug is None else list(self._debug.findings)

    def take_faults(self) -> list[Finding]:
        return [] if self._debug is None else self._debug.take()

    def first_fault(self, finding_id: str | None = None) -> Finding | None:
        """The first finding the debug checks raised (of ``finding_id``, if given)."""
        if self._debug is None:
            return None
        return self._debug.first.get(finding_id or "*")

    def check_invariants(self) -> list[Finding]:
        """Audit the whole pool, vectorised: conservation, ref counts vs live tables, tenants, free vs
        referenced. An empty list means every invariant holds."""
        from kvguardian.runtime.paged.audit import audit

        return audit(self)

    def metrics(self) -> dict[str, float | int]:
        """Blocks by state, residency and fragmentation ratios, prefix hit rate, evictions (see metrics)."""
        from kvguardian.runtime.paged.metrics import pool_metrics

        return pool_metrics(self)

    # ------------------------------------------------------------------ internals
    def _kv(self) -> KVSpec:
        if self.kv is None:
            raise UsageError("this pool keeps bookkeeping only (kv=None); fix: PagedKVPool(..., kv=KVSpec(...))")
        return self.kv

    def _begin(self, op: str, table: BlockTable | None, *, layer: int | None = None) -> None:
        self.op_seq += 1
        if self._debug is not None:
            self._debug.begin(op, table, layer)

    def _end(self, touched: np.ndarray) -> None:
        if self._debug is not None:
            self._debug.end(touched)

    def _claim(self, t: BlockTable, ids: np.ndarray, copy_of: int | None = None) -> None:
        """``ids`` were just allocated to ``t``: scrub what another tenant left, reset their residue marks."""
        if self.remanence is not None:
            self.remanence.claim(t, ids, copy_of)

    def _note_write(self, layer: int, slots: torch.Tensor) -> None:
        if self.remanence is not None:
            self.remanence.wrote(layer, slots)

    def _check_read(self, request_id: str, layer: int, block_ids: torch.Tensor, num_tokens: int) -> None:
        if self.remanence is None or self._debug is None:
            return
        bad = self.remanence.unwritten(layer, block_ids, num_tokens)
        if len(bad):
            self._begin("read", self._tables.get(request_id), layer=layer)
            self._debug.residue_read(request_id, bad, self.remanence.residue_evidence(bad))

    def _table_add(self, t: BlockTable, ids: np.ndarray) -> None:
        t.push(ids)
        if self._debug is not None:
            self._debug.on_table_add(t, ids)

    def _table_remove(self, t: BlockTable, ids: np.ndarray) -> None:
        removed = t.remove(ids, self._mark)
        if self._debug is not None:
            self._debug.on_table_remove(t, removed)

    def _release_all(self, op: str, request_id: str) -> tuple[BlockTable, int]:
        """``op`` (free, preempt) begins on the request's table, which gives back every block: (table, blocks)."""
        t = self.table(request_id)
        self._begin(op, t)
        ids = t.clear()[::-1].copy()  # tail first: a request's last blocks are reused before its prefix
        if self._debug is not None:
            self._debug.pre_release(t, ids, held=True)
            self._debug.on_table_remove(t, ids)
        self.blocks.free_blocks(ids)
        self._end(ids)
        return t, len(ids)

    def _close(self, t: BlockTable) -> None:
        del self._tables[t.request_id]
        t.state = TableState.CLOSED
        if t.num_blocks:
            self._closed[t.code] = t
            if len(self._closed) > _CLOSED_LIMIT:
                self._closed.popitem(last=False)
                self.closed_forgotten += 1

    def _shared_partial_tail(self, t: BlockTable) -> bool:
        return bool(t.num_blocks and t.num_tokens % self.block_size
                    and t.num_tokens > (t.num_blocks - 1) * self.block_size
                    and self.blocks.ref_count(int(t.blocks[t.num_blocks - 1])) > 1)

    def _copy_on_write(self, t: BlockTable) -> np.ndarray:
        old = int(t.blocks[t.num_blocks - 1])
        b = self.blocks.get_new_blocks(1)[0]
        self._claim(t, np.array([b], dtype=np.int32), copy_of=old)
        for layer in range(len(self.k)):
            self.k[layer][b].copy_(self.k[layer][old])
            self.v[layer][b].copy_(self.v[layer][old])
        self.filled[b] = self.filled[old]
        self.ns_of[b] = t.ns_code
        t.blocks[t.num_blocks - 1] = b
        if self._debug is not None:
            self._debug.on_table_remove(t, np.array([old], dtype=np.int32))
            self._debug.on_table_add(t, np.array([b], dtype=np.int32))
            self._debug.assign_slots(t, b * self.block_size + np.arange(self.block_size))
        self.blocks.free_blocks([old])
        self.cow_copies += 1
        return np.array([old, b], dtype=np.int32)

    def _hash_new_blocks(self, t: BlockTable, token_ids: Sequence[int]) -> None:
        """Hash the blocks ``token_ids`` filled; register them in the prefix cache; emit "stored"."""
        if not self.prefix_caching:
            return
        parent0 = t.hashes[-1] if t.hashes else None
        stored_h: list[bytes] = []
        stored_b: list[int] = []
        for index, h in extend_chain(t, token_ids, self.block_size):
            block = int(t.blocks[index])
            if self.blocks.cache_block(block, h):
                stored_h.append(h)
                stored_b.append(block)
        if stored_h:
            self.events.emit("stored", stored_h, stored_b, parent_hash=parent0, owner=t.owner)
