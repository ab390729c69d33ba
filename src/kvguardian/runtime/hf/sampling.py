"""Decode-step sampling: which forwards of a cache the transformers source observes layer by layer.

Observing a layer right after a forward is mostly CPU cache misses, and a request's decode steps are alike, so
after a request's first two forwards only every ``stride``-th forward of a cache is observed (the others are
counted). Between observations the ledger is up to ``stride - 1`` steps old; everything is observed exactly
again at request end, snapshot, crop/reset and the cache's death. A storage kept from a skipped step is not
seen: ``Guard(decode_stride=1)`` observes every step. Conditions and costs: docs/design/hf.md.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from kvguardian.core.ledger import Ledger, RequestInfo
from kvguardian.runtime.hf.observers import CacheUpdate
from kvguardian.runtime.hf.states import CacheState

if TYPE_CHECKING:
    from transformers import Cache

__all__ = ["DEFAULT_STRIDE", "Sampler"]

#: observe one forward in this many, after a request's first two in a cache
DEFAULT_STRIDE = 8


class Sampler:
    """Decides, per forward of a cache, whether the tracker observes it; keeps which caches are followed."""

    __slots__ = ("following", "ledger", "stride")

    def __init__(self, stride: int, ledger: Ledger) -> None:
        self.stride = stride
        self.ledger = ledger
        self.following: dict[int, CacheState] = {}  # cache id -> state of a cache whose entries are followed

    def follow(self, st: CacheState) -> None:
        """The first skipped forward of ``st``'s cache since it was last observed in full: its entries are
        followed from now on (the tracker skips a forward, inlined in `HFTracker.on_updates`, when the cache's
        `skip_left` says so, its one cache is the one updated, its owner is the current request and grad mode is
        off; it only counts the updates in ``st.skipped``)."""
        self.ledger.slots.follow(slots_of(st), on=True)
        st.following = True
        self.following[st.cid] = st

    def after_observed(self, st: CacheState | None, updates: list[CacheUpdate]) -> None:
        """After a forward's ``updates`` were observed: how many of the cache's next forwards to skip."""
        if st is None:
            return
        if st.skipped:
            self.fold_appends(st)
        cache: Cache = updates[0].cache
        rs = st.rs
        if (st.ref() is not cache or st.manual is not None or st.owner_req is None or st.generic
                or (rs is not None and rs.ttft is None)
                or any(u.cache is not cache for u in updates) or not sampleable(st, cache)):
            st.skip_left = 0
            return
        st.skip_left = self.stride - 1

    def fold_appends(self, st: CacheState) -> None:
        """The appends of the skipped updates (a key and a value each), counted at once."""
        self.ledger.slots.skipped(2 * st.skipped)
        st.skipped = 0

    def unfollow(self, st: CacheState, at: float | None = None) -> None:
        """Stop following ``st``'s entries (observed again, or the cache died at ``at``)."""
        self.following.pop(st.cid, None)
        if st.following:
            st.following = False
            self.ledger.slots.follow(slots_of(st), on=False, at=at)
        if st.skipped:
            self.fold_appends(st)

    def followed_by(self, info: RequestInfo) -> list[CacheState]:
        """The followed caches whose current owner is ``info``."""
        return [st for st in self.following.values() if st.owner_req is info]


def sampleable(st: CacheState, cache: Cache) -> bool:
    """Every layer of the cache is planned, with a known layout whose state the tracker can read between forwards
    (cached on the state until a layer is planned again). Not a static layer that counts its filled tokens
    nowhere (transformers 5.0-5.4: only the update's ``cache_position`` says how far it is filled)."""
    ok = st.sampleable
    if ok is None:
        layers = getattr(cache, "layers", None)
        ok = st.sampleable = (
            isinstance(layers, list) and len(layers) == len(st.layers) and bool(layers)
            and all(ls is not None and ls.plan.known and ls.plan.kind != "generic"
                    and (not ls.plan.static or _counts_filled(layer)) for ls, layer in zip(st.layers, layers)))
    return ok


def _counts_filled(layer: Any) -> bool:
    """A static layer keeps its filled tokens in a counter of its own (transformers 5.5+)."""
    return hasattr(layer, "cumulative_length_int") or hasattr(layer, "cumulative_length")


def slots_of(st: CacheState) -> list[Hashable]:
    """Every slot of the cache's planned layers: keys, values and the layers' other tensors."""
    out: list[Hashable] = []
    for ls in st.layers:
        if ls is not None:
            out.extend(site.slot for site in ls.sites)
            out.extend(site.slot for site in ls.extra.values())
    return out


def refresh_update(cache: Cache, idx: int) -> CacheUpdate:
    """The update an observer is given when the tracker observes a layer outside a forward (a refresh)."""
    return CacheUpdate(cache, idx, None, (), {}, None)
