"""What the ledger records: one `Record` per KV entry, one `RequestInfo` per request, and the small named types
sources describe an observation with (`EntrySite`, `Update`).

Ownership: only the ledger (this package) mutates a record or a request; sources go through `Ledger` methods;
snapshots hold copies. What an entry *is* - its id, where it was observed, its generation, dtype and device -
is set when the ledger creates it, in ``Final`` fields: the type checker (part of the suite) refuses any later
assignment, at no cost on the per-step path (a run-time check on every write costs more than the rest of a step,
and made copying 4,000 requests for a snapshot ten times slower). Requests are the same.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

__all__ = ["INDEXED", "NO_FILL", "NO_GRAD", "EntrySite", "EntryState", "EntryView", "Record", "RequestInfo",
           "Update", "unused_of"]


class EntryState(str, enum.Enum):
    """live (owner active) → retained (declared) or orphaned (nothing declared it) → released."""

    LIVE = "live"
    RETAINED = "retained"
    ORPHANED = "orphaned"
    RELEASED = "released"


#: the states of indexed (not yet released) entries
INDEXED = (EntryState.LIVE, EntryState.RETAINED, EntryState.ORPHANED)


class EntrySite(NamedTuple):
    """Where a source observed a KV entry. Constant per logical place, so a source builds it once (per cache
    layer and kind) and passes the same tuple at every step; an entry created there copies its fields."""

    kind: str  # "k", "v", "kv", "block", "qk", ...
    layer: int | None  # model layer index, when known
    source: str  # who reported it ("DynamicLayer", "StaticLayer", "track", "pool", ...)
    slot: Hashable | None = None  # logical place (cache id, layer, kind): a newer storage there supersedes the old
    role: str | None = None  # "self" / "cross" attention for encoder-decoder caches, else None
    cache: str | None = None  # label of the cache object the storage belongs to, when known


class Update(NamedTuple):
    """What a source knows about the update that stored the tensors it reports, besides the tensors."""

    filled_tokens: int | None = None  # tokens holding data (static caches), None when unknown
    capacity_tokens: int | None = None  # token capacity of the storage (static caches), None when unknown
    grad_enabled: bool = True  # False: grad mode was off, so no tensor this update produced requires grad


class EntryView(NamedTuple):
    """What the first observation of an entry saw of its memory (a tensor's, or what a source reports for a block)."""

    shape: tuple[int, ...]
    dtype: str
    device: str
    logical_bytes: int  # the view's bytes
    storage_bytes: int  # the whole storage's bytes
    grad: bool = False  # requires_grad


#: an update that says nothing beyond its tensors (grad mode on, or unknown)
NO_FILL = Update()
#: the same with grad mode off (``torch.is_grad_enabled()`` was False): requires_grad is not read where an
#: entry continues
NO_GRAD = Update(grad_enabled=False)


@dataclass(slots=True, eq=False)
class Record:
    """One KV entry: what it is (the ``Final`` fields, set at creation: mypy refuses any later assignment) and its
    current state, which only the ledger changes.

    A tensor entry is keyed by its storage's data pointer, so views of one storage are one entry. An entry whose
    slot's storage is freed and replaced (DynamicLayer's ``torch.cat`` every step) continues with the new storage
    instead of being released and created again: ``key``, ``storage_bytes``, ``wref`` and ``incarnation``
    change then, and only then. Build records by keyword; `copy` is the one positional construction.
    """

    entry_id: Final[int]  # ledger-assigned, never reused
    key: Hashable  # storage data pointer (tensors) or the source's key (block id, key name); see the class doc
    kind: Final[str]  # "k", "v", "kv", "block", "qk", ...
    layer: Final[int | None]  # model layer index, when known
    request_id: str | None  # owner; changes on a hit (a later request reuses the entry)
    tenant: str | None  # the owner's tenant; changes with request_id
    generation: Final[int]  # model generation when created (a reload bumps it)
    source: Final[str]  # who reported it ("DynamicLayer", "StaticLayer", "track", "pool", ...)
    shape: tuple[int, ...]  # last observed shape of the view ([B, H_kv, S, D] for HF layers; the hot path stores
    # the torch.Size it read, a tuple subclass, and copies make it a plain tuple)
    dtype: Final[str]  # "torch.float16", "" for non-tensor entries
    device: Final[str]  # "cpu", "cuda:0", "" for non-tensor entries
    logical_bytes: int  # bytes of the last observed view (numel * element size)
    storage_bytes: int  # bytes of the whole storage, counted once however many views exist; see the class doc
    created: Final[float]  # time.monotonic() at creation
    last_access: float  # time.monotonic() of the last observation
    state: EntryState = EntryState.LIVE  # changed by request ends, hits, retention marks and the release
    slot: Final[Hashable | None] = None  # logical place (cache id, layer, kind); a newer storage supersedes this one
    superseded: bool = False  # a newer storage took this entry's slot while this one was still alive
    filled_tokens: int | None = None  # tokens holding data (static caches), None when unknown
    capacity_tokens: Final[int | None] = None  # token capacity of the storage (static caches), None when unknown
    grad: bool = False  # requires_grad or grad_fn seen on the tensor
    retained_reason: str | None = None  # set (and cleared) by a declared retention
    released_at: float | None = None  # set once, when the storage was freed (released records leave the index)
    wref: Any = None  # the weak reference whose callback reports the storage's release (never a strong ref)
    role: Final[str | None] = None  # "self" / "cross" attention for encoder-decoder caches, else None
    cache: Final[str | None] = None  # label of the cache object the storage belongs to, when known
    incarnation: int = 0  # storages this entry tracked before the current one (see the class doc)
    appends: int = 0  # appends by the current owner; only the first is buffered as an event
    # the entry follows its slot between a source's observations (`Ledger.slots.follow`): its storage dying is the slot
    # moving on to a newer one the source has not observed yet, not a release
    follows: bool = False

    def __repr__(self) -> str:  # id-only: records are compared and logged by id
        return f"<Record #{self.entry_id} {self.kind} layer={self.layer} {self.state.value}>"

    def copy(self) -> Record:
        """A detached copy for a snapshot: a plain-tuple shape, no weak reference."""
        # The one positional construction of a Record, in field order: cheaper than by keyword
        # (docs/design/ledger.md), and a snapshot copies every record.
        return Record(
            self.entry_id, self.key, self.kind, self.layer, self.request_id, self.tenant, self.generation,
            self.source, tuple(self.shape), self.dtype, self.device, self.logical_bytes, self.storage_bytes,
            self.created, self.last_access, self.state, self.slot, self.superseded, self.filled_tokens,
            self.capacity_tokens, self.grad, self.retained_reason, self.released_at, None, self.role, self.cache,
            self.incarnation,
        )

    @property
    def kv_heads(self) -> int | None:
        return self.shape[1] if len(self.shape) == 4 else None

    @property
    def seq_len(self) -> int | None:
        return self.shape[2] if len(self.shape) == 4 else None

    @property
    def unused_bytes(self) -> int:
        """Bytes of the storage that hold no token: unused static capacity, or the rest of a cropped view."""
        return unused_of(self.storage_bytes, self.logical_bytes, self.filled_tokens, self.capacity_tokens)


def unused_of(storage_bytes: int, logical_bytes: int, filled_tokens: int | None, capacity_tokens: int | None) -> int:
    """`Record.unused_bytes` of a record with these fields: with a fill and a capacity, the storage's share of
    the capacity that holds no token; otherwise the storage beyond the view. Never negative."""
    if filled_tokens is not None and capacity_tokens:
        used = storage_bytes * (filled_tokens if filled_tokens < capacity_tokens else capacity_tokens)
        used //= capacity_tokens
        return storage_bytes - used if storage_bytes > used else 0
    return storage_bytes - logical_bytes if storage_bytes > logical_bytes else 0


@dataclass(slots=True, eq=False)
class RequestInfo:
    """One request (or an implicit one: a bare generate() call, a manually driven cache).

    The ``Final`` fields are set by the constructor only (mypy refuses any later assignment); ``ended`` is set
    once, by `Ledger.end_request`, which refuses to end a request twice; ``entry_ids`` is the ledger's to change.
    """

    request_id: Final[str]
    tenant: Final[str | None]
    generation: Final[int]  # model generation when the request began
    started: Final[float]  # time.monotonic() at begin_request
    ended: float | None = None  # set once, by end_request
    implicit: Final[bool] = False  # created by kv-guardian, not by the user
    entry_ids: set[int] = field(default_factory=set)  # live entries it owns (ledger-maintained)
    site: Final[str | None] = None  # the user's line that began it (`callsite.user_site`): a generate() call...

    def __repr__(self) -> str:
        return f"<Request {self.request_id!r} {'ended' if self.ended is not None else 'active'}>"

    @property
    def active(self) -> bool:
        return self.ended is None

    def copy(self) -> RequestInfo:
        """A detached copy for a snapshot (positional, in field order: a snapshot copies every request)."""
        return RequestInfo(self.request_id, self.tenant, self.generation, self.started, self.ended, self.implicit,
                           set(self.entry_ids), self.site)
