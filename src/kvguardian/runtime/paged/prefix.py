"""Tenant-salted prefix hashes and the pool's lifecycle event stream.

A full block's hash is chained from a root derived from the table's namespace (``tenant:<name>``, or
``shared:<name>``), so equal prefixes share blocks within a namespace and never across: the salt is part of
every hash, and KVG205 verifies it held. Hashes are SHA-256 truncated to 128 bits, so a collision is no
practical way to share a block. Events (``stored``/``removed``/``cleared``/``hit``) carry ids, hashes and counts,
never tokens or K/V. Why SHA-256: docs/design/paged.md.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from hashlib import blake2b, sha256
from typing import TYPE_CHECKING, Any

from kvguardian.core.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from kvguardian.runtime.paged.records import BlockTable

__all__ = [
    "EVENT_KINDS",
    "EventStream",
    "KVEvent",
    "chain_hash",
    "encode_extra_keys",
    "extend_chain",
    "hash_full_blocks",
    "lookup_chain",
    "namespace_for",
    "namespace_root",
]

DIGEST_BYTES = 16
_ROOT_PREFIX = b"kvguardian/prefix/v1\x00"

#: Event kinds, vLLM's names in lower case plus ``hit``.
EVENT_KINDS = ("stored", "removed", "cleared", "hit")


def namespace_for(tenant: str, shared: str | None = None) -> str:
    """The prefix-cache namespace of a table: the tenant's own, or a shared one the tenant opted into."""
    if not isinstance(tenant, str) or not tenant:
        raise UsageError(f"tenant must be a non-empty string, got {tenant!r}; fix: pass the request's tenant id")
    if shared is not None:
        if not isinstance(shared, str) or not shared:
            raise UsageError(f"shared namespace must be a non-empty string, got {shared!r}")
        return f"shared:{shared}"
    return f"tenant:{tenant}"


def namespace_root(namespace: str) -> bytes:
    """The salt every hash chain of ``namespace`` starts from."""
    return blake2b(_ROOT_PREFIX + namespace.encode("utf-8"), digest_size=DIGEST_BYTES).digest()


def encode_extra_keys(extra_keys: Sequence[object]) -> bytes:
    """Extra keys (LoRA name, multimodal hashes, ...) as bytes hashed into every block of a request."""
    for key in extra_keys:
        if not isinstance(key, (str, int, bytes)):
            raise UsageError(
                f"extra key {key!r} is a {type(key).__name__}; fix: use str, int or bytes extra keys"
            )
    return repr(tuple(extra_keys)).encode("utf-8")


def chain_hash(parent: bytes, token_ids: Sequence[int], extra: bytes = b"") -> bytes:
    """``hash(parent, token ids, extra keys)`` of one full block: SHA-256 of ``parent``, the token ids as
    little-endian int64 and ``extra``, concatenated, truncated to 16 bytes."""
    return sha256(parent + _token_bytes(token_ids, len(token_ids)) + extra).digest()[:DIGEST_BYTES]


@lru_cache(maxsize=512)
def _packer(n: int) -> Callable[..., bytes]:
    return struct.Struct(f"<{n}q").pack


_PACK = {n: _packer(n) for n in range(16, 16 * 65, 16)}  # prompt lengths of whole 16-token blocks, precompiled


def _token_bytes(token_ids: Sequence[int], n: int) -> bytes:
    """The first ``n`` token ids as little-endian int64 bytes, converted once for a whole chain (a compiled
    `struct.Struct`, cheaper than ``array("q", ...)``: docs/design/paged.md)."""
    pack = _PACK.get(n) or _packer(n)
    return pack(*token_ids[:n])


def hash_full_blocks(
    parent: bytes, token_ids: Sequence[int], block_size: int, extra: bytes = b"", *, limit: int | None = None
) -> list[bytes]:
    """Chained hashes of the full blocks of ``token_ids`` (at most ``limit`` of them)."""
    n = len(token_ids) // block_size
    if limit is not None:
        n = min(n, limit)
    buf = _token_bytes(token_ids, n * block_size)
    step = 8 * block_size
    out = []
    for i in range(0, n * step, step):
        parent = sha256(parent + buf[i:i + step] + extra).digest()[:DIGEST_BYTES]
        out.append(parent)
    return out


def lookup_chain(index: Mapping[bytes, int], root: bytes, token_ids: Sequence[int], block_size: int,
                 extra: bytes = b"") -> tuple[list[int], list[bytes]]:
    """Blocks of the longest cached chain of ``token_ids``' full blocks, and their hashes. At least one token
    is left out, so a request always computes its last token."""
    n = (len(token_ids) - 1) // block_size
    hits: list[int] = []
    hashes: list[bytes] = []
    if n <= 0:
        return hits, hashes
    m = n * block_size
    buf = (_PACK.get(m) or _packer(m))(*token_ids[:m])  # _token_bytes, inlined: a lookup's fixed cost
    step = 8 * block_size
    get = index.get
    parent = root
    for i in range(0, n * step, step):
        h = sha256(parent + buf[i:i + step] + extra).digest()[:DIGEST_BYTES]
        b = get(h)
        if b is None:
            break
        hits.append(b)
        hashes.append(h)
        parent = h
    return hits, hashes


def extend_chain(table: BlockTable, token_ids: Sequence[int], block_size: int) -> list[tuple[int, bytes]]:
    """Add ``token_ids`` to ``table``'s partial tail; hash every block they fill (appended to
    ``table.hashes``). Returns (block index in the table, hash) of the newly full blocks."""
    tail = table.tail_tokens
    tail.extend(token_ids)
    if len(tail) < block_size:
        return []
    full = len(tail) // block_size
    hashes = hash_full_blocks(table.hashes[-1] if table.hashes else table.root, tail, block_size, table.extra)
    start = len(table.hashes)
    table.hashes.extend(hashes)
    del tail[:full * block_size]
    return list(zip(range(start, start + full), hashes))


@dataclass(frozen=True, slots=True)
class KVEvent:
    """One prefix-cache lifecycle event. Never carries token ids or K/V contents."""

    seq: int  # position in the pool's stream, from 1, no gaps (a consumer can detect drops)
    ts: float  # clock time of the change
    kind: str  # one of EVENT_KINDS
    block_hashes: tuple[str, ...]  # hex digests (empty for "cleared")
    block_ids: tuple[int, ...]  # physical blocks, same order as block_hashes
    parent_hash: str | None = None  # "stored": hash of the block before the first one, None at the root
    request_id: str | None = None  # "stored"/"hit": the request that filled or reused the blocks
    tenant: str | None = None
    namespace: str | None = None
    block_bytes: int = 0  # K/V bytes of one block over all layers (0 for a bookkeeping-only pool)

    def to_dict(self) -> dict[str, object]:
        return {
            "seq": self.seq, "ts": self.ts, "kind": self.kind, "block_hashes": list(self.block_hashes),
            "block_ids": list(self.block_ids), "parent_hash": self.parent_hash, "request_id": self.request_id,
            "tenant": self.tenant, "namespace": self.namespace, "block_bytes": self.block_bytes,
        }


class EventStream:
    """A bounded buffer of `KVEvent`s; `take` swaps it out so no consumer keeps events twice.

    `emit` stores a tuple of atomic values (hashes as bytes, ids as ints, owner strings); the frozen
    `KVEvent`, with its hex digests, is built by `take`. A tuple of atomic values is untracked by Python's
    garbage collector after its first collection, so a full buffer does not make every later collection walk
    8,192 events and their lists: with a dataclass (or a dict of fields) per event, an allocation that
    evicts one block cost several times as much, most of it in collections (docs/design/paged.md).
    """

    def __init__(self, capacity: int = 8192, clock: Callable[[], float] = time.monotonic, *,
                 enabled: bool = True, block_bytes: int = 0) -> None:
        if capacity < 1:
            raise UsageError(f"event capacity must be >= 1, got {capacity}")
        self._buf: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self._clock = clock
        self.seq = 0  # last sequence number handed out
        self.dropped = 0  # events pushed out of the full buffer before anyone took them
        self.enabled = enabled  # False: emit is a no-op (nobody consumes this stream)
        self.block_bytes = block_bytes  # K/V bytes of one block, carried by "stored" and "hit" events

    def emit(self, kind: str, hashes: Sequence[bytes], block_ids: Sequence[int], *,
             owner: tuple[str, str, str] | None = None, parent_hash: bytes | None = None) -> None:
        """Buffer one event; ``owner`` is (request id, tenant, namespace) of a "stored" or "hit" (whose event
        also carries the stream's ``block_bytes``)."""
        if not self.enabled:
            return
        buf = self._buf
        if len(buf) == buf.maxlen:
            self.dropped += 1
        self.seq += 1
        buf.append((self.seq, self._clock(), kind, tuple(hashes), tuple(block_ids), owner, parent_hash,
                    self.block_bytes if owner is not None else 0))

    def take(self) -> list[KVEvent]:
        raw = list(self._buf)
        self._buf.clear()
        out = []
        for seq, ts, kind, hashes, ids, owner, parent, nbytes in raw:
            rid, tenant, ns = owner if owner is not None else (None, None, None)
            out.append(KVEvent(seq, ts, kind, tuple(h.hex() for h in hashes), tuple(int(b) for b in ids),
                               parent_hash=parent.hex() if parent is not None else None, request_id=rid,
                               tenant=tenant, namespace=ns, block_bytes=nbytes))
        return out

    def __len__(self) -> int:
        return len(self._buf)
