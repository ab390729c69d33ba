"""What the transformers source keeps per live cache object and per active request (no strong reference to
either: a cache is held by weak reference, a request by the ledger's own `RequestInfo`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvguardian.core.ledger import EntrySite, RequestInfo
from kvguardian.runtime.hf.observers import LayerState

if TYPE_CHECKING:
    from transformers import Cache

__all__ = ["CacheState", "RequestState", "track_cache", "tracker_of"]

#: cache -> the tracker that observed it last (weakly, both ways): a crop or reorder between two forwards of an
#: attached model (beam search's ``reorder_cache``, outside any forward) reaches the tracker that knows the cache
_KNOWN: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()


def track_cache(cache: Cache, tracker: Any) -> None:
    """Remember that ``tracker`` (an `HFTracker`) follows ``cache``; called for each new cache state."""
    try:
        _KNOWN[cache] = weakref.ref(tracker)
    except TypeError:  # not weak-referenceable or not hashable: found only inside forwards
        pass


def tracker_of(cache: Cache) -> Any:
    """The tracker that follows ``cache``, or None."""
    try:
        ref = _KNOWN.get(cache)
    except TypeError:
        return None
    return ref() if ref is not None else None


class CacheState:
    """What the tracker knows about one live cache object (held by weak reference)."""

    __slots__ = (
        "__weakref__",
        "cid",
        "died",
        "fields",
        "following",
        "generic",
        "generic_sites",
        "init_done",
        "label",
        "layer_count",
        "layers",
        "manual",
        "owner",
        "owner_req",
        "ref",
        "role",
        "rs",
        "sampleable",
        "skip_left",
        "skipped",
    )

    def __init__(self, cache: Cache, label: str, role: str | None,
                 on_dead: Callable[[weakref.ref[Cache]], object]) -> None:
        self.cid = id(cache)
        self.ref = weakref.ref(cache, on_dead)
        self.label = label  # "DynamicCache#3", "EncoderDecoderCache#1.cross"
        self.role = role  # "self" / "cross" for encoder-decoder sub-caches
        self.layers: list[LayerState | None] = []  # by layer index, planned lazily
        self.owner: str | None = None  # request id of the last request that updated it
        self.owner_req: RequestInfo | None = None
        self.rs: RequestState | None = None  # the owner's state while it is active
        self.manual: RequestInfo | None = None  # open implicit request of a manually driven cache
        self.init_done = False
        # no `layers` list (a 4.x-style cache with its own storage): the tensors update() returns are observed
        self.generic = not isinstance(getattr(cache, "layers", None), list)
        self.generic_sites: dict[tuple[int, str], EntrySite] = {}  # (layer, kind) -> site, on the generic path
        self.fields: dict[str, Any] = {}  # init fields (shape, dtype, device) until the init event is emitted
        self.layer_count = 0
        # decode-step sampling (`hf.sampling`): forwards of this cache to skip, updates skipped since the last
        # observed one, whether its entries are followed, whether every layer can be sampled (None: not known)
        self.skip_left = 0
        self.skipped = 0
        self.following = False
        self.sampleable: bool | None = None
        self.died: float | None = None  # when the cache was collected (its weak reference's callback)

    def __repr__(self) -> str:
        return f"<CacheState {self.label}>"

    def slots(self) -> list[Any]:
        """The slots of every planned layer's keys and values."""
        return [site.slot for ls in self.layers if ls is not None for site in ls.sites]


class RequestState:
    """Per active request: first-token latency and what it reused."""

    __slots__ = ("caches", "first_layer", "first_st", "hits", "inits", "prefill", "req", "reused", "start", "ttft")

    def __init__(self, req: RequestInfo, now: float) -> None:
        self.req = req
        self.start = min(req.started, now)
        self.first_st: CacheState | None = None  # the first cache it updated, and the first layer
        self.first_layer = -1
        self.ttft: float | None = None  # first-token latency, once that layer's second update is seen
        self.caches = 0  # caches it updated
        self.reused = 0  # tokens it started from that earlier requests had filled
        self.prefill = 0  # tokens it added in its first update of each cache
        self.hits: list[tuple[CacheState, str | None, float]] = []  # (cache, previous owner, hit ratio)
        self.inits: list[CacheState] = []  # caches it started cold
