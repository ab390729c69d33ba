"""Records of the paged pool: the K/V layout and the per-request block table.

Ownership is explicit in the record: a `BlockTable` is bound to one (request id, tenant) for its whole life,
and the pool is the only writer of its mutable fields.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from kvguardian.core.errors import InternalError, UsageError

__all__ = ["BlockTable", "KVSpec", "TableState"]


@dataclass(frozen=True)
class KVSpec:
    """Shape of the preallocated K/V tensors: per layer, ``[num_blocks, block_size, kv_heads, head_dim]``."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "float32"  # a torch dtype name
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("num_layers", "kv_heads", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise UsageError(f"KVSpec.{name} must be a positive int, got {v!r}")

    def block_bytes(self, block_size: int) -> int:
        """K and V bytes of one block over all layers."""
        import torch

        itemsize = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        return 2 * self.num_layers * block_size * self.kv_heads * self.head_dim * itemsize

    @classmethod
    def from_config(cls, config: object, *, dtype: str = "float32", device: str = "cpu") -> KVSpec:
        """The spec of a transformers model config (Llama-like: hidden size, heads, KV heads, layers)."""
        heads = int(config.num_attention_heads)  # type: ignore[attr-defined]
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads  # type: ignore[attr-defined]
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        return cls(int(config.num_hidden_layers), kv_heads, int(head_dim), dtype, device)  # type: ignore[attr-defined]


class TableState(str, enum.Enum):
    """open (holds or may take blocks) ⇄ preempted (blocks released, waits to recompute) → closed."""

    OPEN = "open"
    PREEMPTED = "preempted"
    CLOSED = "closed"


@dataclass(slots=True, eq=False)
class BlockTable:
    """The blocks of one request, in token order. Only `PagedKVPool` mutates it.

    Invariants (checked by the pool where they change, and by its audit): ``blocks[:num_blocks]`` are
    distinct; ``num_tokens <= num_blocks * block_size``; ``len(hashes) <= num_tokens // block_size``;
    ``tail_tokens`` holds exactly the tokens of the last, partially filled block.
    """

    request_id: str  # write-once: the owner request
    tenant: str  # write-once: the owner's tenant
    namespace: str  # write-once: prefix-cache namespace, "tenant:<tenant>" or "shared:<name>"
    code: int  # write-once: the pool's integer id of this table (never reused)
    ns_code: int  # write-once: the pool's integer id of the namespace
    root: bytes  # write-once: first parent hash of the chain (the namespace's salt)
    extra: bytes  # write-once: encoded extra keys, hashed into every block
    opened: float  # write-once: clock time of open()
    blocks: np.ndarray = field(default_factory=lambda: np.empty(8, dtype=np.int32))  # grows by doubling
    num_blocks: int = 0  # live length of blocks
    live: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))  # view blocks[:num_blocks]
    num_tokens: int = 0  # token slots assigned, in order; the engine writes their K/V
    hashes: list[bytes] = field(default_factory=list)  # chained hashes of the full blocks, in order
    tail_tokens: list[int] = field(default_factory=list)  # token ids of the partial last block (hashing only)
    state: TableState = TableState.OPEN
    preemptions: int = 0  # times its blocks were taken back to make room
    owner: tuple[str, str, str] = field(init=False)  # (request_id, tenant, namespace), for events

    def __post_init__(self) -> None:
        self.owner = (self.request_id, self.tenant, self.namespace)

    def __repr__(self) -> str:  # ids only: a table is logged by whom it belongs to
        return f"<BlockTable {self.request_id!r} tenant={self.tenant!r} {self.num_blocks} blocks {self.state.value}>"

    @property
    def block_ids(self) -> np.ndarray:
        """A view of the live block ids (do not keep it across pool operations: copy it)."""
        return self.live

    def _set_len(self, n: int) -> None:
        self.num_blocks = n
        self.live = self.blocks[:n]

    def push(self, ids: np.ndarray) -> None:
        n = self.num_blocks + len(ids)
        if n > len(self.blocks):
            grown = np.empty(max(n, 2 * len(self.blocks)), dtype=np.int32)
            grown[: self.num_blocks] = self.blocks[: self.num_blocks]
            self.blocks = grown
        self.blocks[self.num_blocks:n] = ids
        self._set_len(n)

    def remove(self, ids: np.ndarray, scratch: np.ndarray) -> np.ndarray:
        """Drop ``ids`` from the table (keeping order); returns the ids that were in it. ``scratch`` is an
        all-False bool array over the pool's blocks, left all-False (a mark instead of a sort)."""
        live = self.blocks[: self.num_blocks]
        scratch.put(ids, True)
        held = scratch.take(live)
        scratch.put(ids, False)
        kept = live[~held]
        removed = live[held]
        self.blocks[: len(kept)] = kept
        self._set_len(len(kept))
        return removed

    def clear(self) -> np.ndarray:
        """Empty the table; returns its former blocks (a copy) in token order."""
        out = self.blocks[: self.num_blocks].copy()
        self._set_len(0)
        self.num_tokens = 0
        self.hashes.clear()
        self.tail_tokens.clear()
        return out

    def check(self, block_size: int) -> None:
        """Raise `InternalError` if the record broke its own invariants (a pool bug)."""
        if self.num_tokens > self.num_blocks * block_size:
            raise InternalError(f"pool bug: {self!r} has {self.num_tokens} tokens in {self.num_blocks} blocks")
        if len(self.hashes) > self.num_tokens // block_size:
            raise InternalError(f"pool bug: {self!r} has {len(self.hashes)} hashes for {self.num_tokens} tokens")
        if self.tail_tokens and len(self.hashes) * block_size + len(self.tail_tokens) != self.num_tokens:
            raise InternalError(f"pool bug: {self!r} tail of {len(self.tail_tokens)} tokens after "
                                f"{len(self.hashes)} hashed blocks does not end at token {self.num_tokens}")
