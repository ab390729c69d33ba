"""The transformers source of one guard: which request owns each cache, what each layer stores (observed by the
layer's observer, `hf.observers`), manually driven caches as implicit requests, crop/reset evictions.

Called from the ``Cache.update`` wrapper (`hf.instrument`) once per layer per step: everything there is O(1)
per layer (dictionary lookups, attribute reads, the ledger's paired observe); nothing walks the cache. The
tracker talks to the rest of kv-guardian through its `SourceHost` only.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvguardian.core import faults as _faults
from kvguardian.core.ledger import EntrySite, EntryState, Record, RequestInfo, Update
from kvguardian.core.reuse import ReuseWindow
from kvguardian.runtime.hf.layers import plan_for, static_filled
from kvguardian.runtime.hf.lifecycle import Lifecycle
from kvguardian.runtime.hf.observers import CacheUpdate, LayerState, ObserveEnv
from kvguardian.runtime.hf.roles import cache_role
from kvguardian.runtime.hf.sampling import DEFAULT_STRIDE, Sampler, refresh_update
from kvguardian.runtime.hf.states import CacheState, track_cache

if TYPE_CHECKING:
    from transformers import Cache

    from kvguardian.runtime.sources.host import SourceHost

__all__ = ["CacheState", "HFTracker"]

_labels = itertools.count(1)

_MAX_RESULTS = 4_096  # requests whose result (weakly) is remembered as a holder-search hint
_RECHECKS = 3  # request ends after its owner's at which a kept cache is looked at for moved layers
_MAX_COPIES = 4_096  # deep copies of caches waiting to be seen (weakly), the latest kept

#: why a cache goes through the generic path (KVG107)
#: layer kinds whose ``keys``/``values`` a program or transformers may replace between updates (a device move)
MOVABLE = frozenset({"dynamic", "sliding", "hybrid"})

_GENERIC = "the cache has no `layers` list: the tensors returned by update() are audited per layer"


def _grad_mode() -> Callable[[], bool]:
    """``torch.is_grad_enabled``; without torch nothing can require grad."""
    try:
        from torch import is_grad_enabled
    except ImportError:
        return lambda: False
    return is_grad_enabled


class HFTracker:
    """The transformers source of one guard (a `Source` of its host).

    Args:
        host: what the tracker reports to (the guard's `RequestScope`).
        reuse: the cross-request reuse window it samples at each request end (default: its own).
    """

    def __init__(self, host: SourceHost, *, reuse: ReuseWindow | None = None,
                 decode_stride: int = DEFAULT_STRIDE) -> None:
        self.host = host
        self.ledger = host.ledger
        self._clock = self.ledger.clock
        self.caches: dict[int, CacheState] = {}
        self._dead: deque[CacheState] = deque()
        self._manual_open: dict[str, CacheState] = {}
        self._manual_ids = itertools.count(1)
        self._by_ref: dict[int, CacheState] = {}  # id(weakref to a cache) -> its state
        self._on_dead = self._make_on_dead()
        self.lifecycle = Lifecycle(self.ledger, reuse if reuse is not None else ReuseWindow(clock=self._clock),
                                   self.caches, self._now)
        # request id -> weak reference to what its generate() returned (it holds the cache): search hints
        self._results: OrderedDict[str, weakref.ref[Any]] = OrderedDict()
        # deep copies of known caches not looked at yet: (weak reference to the copy, the request whose KV it is,
        # the original's label); see `note_copy`
        self._copies: deque[tuple[weakref.ref[Any], RequestInfo, str]] = deque(maxlen=_MAX_COPIES)
        # caches of recently ended requests, looked at again for moved layers at the next request ends, with the
        # number of looks left (`_recheck_moved`)
        self._recheck: deque[tuple[CacheState, int]] = deque()
        self.skipped: dict[str, str] = {}  # layer class -> reason it holds no KV
        self.notes: dict[str, str] = {}
        self.updates = 0
        # the start of the forward whose deferred updates are being observed (None: updates observed as they
        # happen): the time a request starts and its first token is out are measured from forward starts
        self._event_time: float | None = None
        # bound once: attribute chains cost as much as the calls on the per-layer path
        self._current_request = host.current_request
        self._note_grad = host.note_grad
        # grad mode off (inference_mode, no_grad): nothing an update stores requires grad, so the ledger does not
        # read requires_grad where an entry continues
        self._env = ObserveEnv.of(self.ledger, _grad_mode())
        self._grad_enabled = self._env.grad_enabled
        # which forwards of a cache are observed (`hf.sampling`); None: every one
        self.sampler = Sampler(decode_stride, self.ledger) if decode_stride > 1 else None
        host.add_source(self)

    @property
    def reuse(self) -> ReuseWindow:
        return self.lifecycle.reuse

    @property
    def cold_ttft(self) -> deque[float]:
        return self.lifecycle.cold_ttft

    @property
    def unknown(self) -> dict[str, str]:
        """Cache and layer classes audited through the generic path: class -> why (KVG107)."""
        return self.ledger.notes.unknown_classes()

    def _now(self) -> float:
        """The time of the update being observed: its forward's start when observed after the forward."""
        t = self._event_time
        return t if t is not None else self._clock()

    # ------------------------------------------------------------------ the hot path
    def on_updates(self, updates: list[CacheUpdate], started: float | None) -> None:
        """The cache updates of one forward of an attached model, observed when it returned, in order.
        ``started`` (the forward's start) stands for the time of each update when a request's first-token
        latency is measured."""
        sampler = self.sampler
        if sampler is not None and not self._dead:  # a skipped forward (`hf.sampling`), inlined: only counted
            cache = updates[0].cache
            st = self.caches.get(id(cache))
            if (st is not None and st.skip_left > 0 and updates[-1].cache is cache
                    and self._current_request() is st.owner_req and not self._grad_enabled()):
                if not st.following:
                    try:
                        sampler.follow(st)
                    except Exception as exc:  # fail open: this forward and the next are observed
                        st.skip_left = 0
                        self.host.fail("cache.update", exc)
                if st.following:
                    st.skip_left -= 1
                    n = len(updates)
                    st.skipped += n
                    self.updates += n
                    return
        self._event_time = started
        ledger = self.ledger
        ledger.begin_batch()
        try:
            on_update = self.on_update
            for u in updates:
                try:
                    on_update(u)
                except Exception as exc:
                    self.host.fail("cache.update", exc)
        finally:
            self._event_time = None
            ledger.end_batch()
        if sampler is not None:
            try:
                sampler.after_observed(self.caches.get(id(updates[0].cache)), updates)
            except Exception as exc:  # fail open: the next forwards are observed
                self.host.fail("cache.update", exc)

    def on_update(self, u: CacheUpdate) -> None:
        """After ``cache.update(key_states, value_states, layer_idx, *args, **kwargs)`` returned ``out``."""
        if _faults.FAULTS:
            _faults.maybe_fail("cache.update")
        self.updates += 1
        if self._dead:
            self._process_dead()
        cache = u.cache
        st = self.caches.get(id(cache))
        if st is None or st.ref() is not cache:
            st = self._new_cache(cache)
        req = self._current_request()
        if req is None:
            req = st.manual
            if req is None or req.ended is not None:
                req = self._begin_manual(st)
        if st.owner_req is not req:
            self.host.kv_growing()  # the pre-OOM guard samples where a request's KV starts to grow
            self.lifecycle.enter(st, req, u)
        idx = u.layer_idx
        rs = st.rs
        if rs is not None and rs.ttft is None:
            self.lifecycle.first_token(rs, st, idx)
        if st.generic:
            self._observe_returned(st, req, u)
            return
        layers = cache.layers
        layer = layers[idx]
        ls = st.layers[idx] if idx < len(st.layers) else None
        if ls is None or type(layer) is not ls.cls:
            ls = self._plan_layer(st, idx, layer, len(layers))
        grad = ls.observe(self._env, ls, layer, req, u)
        if grad is not None:
            self._note_grad(grad, idx)

    def _observe_returned(self, st: CacheState, req: RequestInfo, u: CacheUpdate) -> None:
        """A cache without a `layers` list: the keys and values update() returned."""
        import torch

        out, idx = u.out, u.layer_idx
        if not isinstance(out, (tuple, list)):
            return
        for kind, t in zip(("k", "v"), out):
            if isinstance(t, torch.Tensor):
                site = st.generic_sites.get((idx, kind))
                if site is None:  # its source is the cache's own class: it has no layer classes
                    site = st.generic_sites[(idx, kind)] = EntrySite(
                        kind, idx, type(u.cache).__name__, (st.cid, idx, kind), st.role, st.label)
                self.ledger.observe(t, site, req)
                if t.requires_grad:
                    self._note_grad(t, idx)

    # ------------------------------------------------------------------ cache states
    def _new_cache(self, cache: Cache) -> CacheState:
        old = self.caches.get(id(cache))
        if old is not None:  # the address was reused by a new cache before the old one's death was seen
            if self._by_ref.pop(id(old.ref), None) is not None:
                self._dead.append(old)
            self._process_dead()
        role_info = cache_role(cache)
        if role_info is not None:
            role, parent = role_info
            label = f"{parent}.{role}"
        else:
            role = None
            label = f"{type(cache).__name__}#{next(_labels)}"
        st = CacheState(cache, label, role, self._on_dead)
        track_cache(cache, self)
        self.caches[st.cid] = st
        self._by_ref[id(st.ref)] = st
        layers = getattr(cache, "layers", None)
        if isinstance(layers, list):  # classify every layer once (O(layers)): skipped ones get their reason now
            for i, layer in enumerate(layers):
                self._plan_layer(st, i, layer, len(layers))
        if st.generic:
            self.ledger.notes.unknown(f"{type(cache).__module__}.{type(cache).__qualname__}", _GENERIC)
        return st

    def _make_on_dead(self) -> Any:
        dead = self._dead
        by_ref = self._by_ref

        clock = self._clock

        def on_dead(ref: weakref.ref[Any]) -> None:  # inside a deallocation: only queue it
            st = by_ref.pop(id(ref), None)
            if st is not None:
                st.died = clock()
                dead.append(st)

        return on_dead

    def _process_dead(self) -> None:
        while self._dead:
            st = self._dead.popleft()
            if self.caches.get(st.cid) is st:
                del self.caches[st.cid]
            if self.sampler is not None:
                self.sampler.unfollow(st, st.died)
            if st.init_done or st.owner is not None:
                self.ledger.notes.cache_event("release", cache=st.label, request=st.owner_req, detail="freed")
            if st.manual is not None and st.manual.ended is None:
                self._end_manual(st)

    def _plan_layer(self, st: CacheState, idx: int, layer: Any, count: int) -> LayerState:
        """Classify layer ``idx`` of ``st`` (again, when its class changed) among the cache's ``count`` layers:
        its observer and its sites."""
        layers = st.layers
        if len(layers) <= idx:
            layers.extend([None] * (max(count, idx + 1) - len(layers)))
            st.layer_count = len(layers)
        plan = plan_for(layer)
        sites = (EntrySite("k", idx, plan.cls_name, (st.cid, idx, "k"), st.role, st.label),
                 EntrySite("v", idx, plan.cls_name, (st.cid, idx, "v"), st.role, st.label))
        ls = layers[idx] = LayerState(plan, idx, sites)
        st.sampleable = None
        if plan.skip_reason:
            self.skipped.setdefault(plan.cls_name, plan.skip_reason)
        if plan.note:
            self.notes.setdefault(plan.cls_name, plan.note)
        if not plan.known:
            self.ledger.notes.unknown(plan.cls_name, plan.note or "unknown layer class")
        return ls

    def classify(self, cache: Cache) -> dict[str, Any]:
        """Every layer of ``cache`` with its kind and, for layers holding no KV, the reason (O(layers))."""
        out: dict[str, Any] = {"class": type(cache).__name__, "layers": []}
        layers = getattr(cache, "layers", None)
        if not isinstance(layers, list):
            out["generic"] = True
            return out
        for i, layer in enumerate(layers):
            plan = plan_for(layer)
            out["layers"].append({"index": i, "class": plan.cls_name, "kind": plan.kind, "known": plan.known,
                                  "skip_reason": plan.skip_reason})
        return out

    # ------------------------------------------------------------------ manually driven caches
    def _begin_manual(self, st: CacheState) -> RequestInfo:
        """A cache driven outside any request is one: it starts now and ends when another request starts,
        when the cache is freed, or at the final check."""
        self.end_manual()
        info = self.ledger.begin_request(f"cache-{next(self._manual_ids)}", None, implicit=True)
        st.manual = info
        self._manual_open[info.request_id] = st
        return info

    def _end_manual(self, st: CacheState) -> None:
        info = st.manual
        st.manual = None
        if info is None or info.ended is not None:
            return
        self._manual_open.pop(info.request_id, None)
        self.host.end_manual(info)

    # ------------------------------------------------------------------ the Source protocol
    def end_manual(self) -> None:
        """End every open manually-driven-cache request (a new request is starting, or the final check)."""
        for st in list(self._manual_open.values()):
            self._end_manual(st)

    def request_ending(self, info: RequestInfo) -> None:
        """Before the ledger ends ``info``: the caches it updated whose decode steps were sampled are observed as
        they are now (`hf.sampling`), so its end sees its KV exactly."""
        if self.sampler is None:
            return
        if self._dead:
            self._process_dead()
        for st in self.sampler.followed_by(info):
            self._refresh(st)

    def _refresh(self, st: CacheState) -> None:
        """Observe every layer of a followed cache as it is now, then stop following it (`hf.sampling`)."""
        cache = st.ref()
        owner = st.owner_req
        if cache is not None and owner is not None and not st.generic:
            ledger, env = self.ledger, self._env
            ledger.begin_batch()
            try:
                layers = cache.layers
                for idx, ls in enumerate(st.layers[: len(layers)]):
                    layer = layers[idx]
                    if ls is not None and type(layer) is ls.cls:
                        ls.observe(env, ls, layer, owner, refresh_update(cache, idx))
            finally:
                ledger.end_batch()
        if self.sampler is not None:
            self.sampler.unfollow(st)

    def request_ended(self, info: RequestInfo) -> None:
        """After the ledger ended ``info``: flush its pending events and add its reuse sample; copies made since
        the last request ended are looked at (`note_copy`)."""
        owned = self.lifecycle.request_ended(info)
        if self._copies:
            self._adopt_copies()
        self._recheck_moved(owned)

    def _recheck_moved(self, owned: list[CacheState]) -> None:
        """At each request end, the caches of the last few ended requests are looked at for layers moved since
        (`_observe_if_moved`: a program parks a kept cache on another device or dtype right after the request),
        so what they hold is in the ledger when retention is sampled; each cache `_RECHECKS` times, then only
        before snapshots (`sync`)."""
        queue = self._recheck
        for _ in range(len(queue)):
            try:
                st, left = queue.popleft()
            except IndexError:  # another thread's request end took the rest
                break
            cache = st.ref()
            owner = st.owner_req
            # a cache a newer request updates is that request's (queued again when it ends)
            if cache is None or self.caches.get(st.cid) is not st or owner is None or owner.ended is None:
                continue
            layers = cache.layers
            for idx, ls in enumerate(st.layers[: len(layers)]):
                if ls is not None and ls.plan.kind in MOVABLE:
                    self._observe_if_moved(ls, layers[idx], owner)
            if left > 1:
                queue.append((st, left - 1))
        queue.extend((st, _RECHECKS) for st in owned if not st.generic)

    def sync(self) -> None:
        """Bring the filled-token counts of static layers up to date (O(layers) per live cache): done before
        a snapshot, not on every step, because reading a tensor counter costs more than the rest of a step's
        bookkeeping. Pending copies of caches are looked at first (`note_copy`)."""
        if self._dead:
            self._process_dead()
        if self._copies:
            self._adopt_copies()
        if self.sampler is not None:
            for followed in list(self.sampler.following.values()):
                self._refresh(followed)
        for st in list(self.caches.values()):
            cache = st.ref()
            if cache is None or st.generic or st.owner_req is None:
                continue
            layers = cache.layers
            for idx, ls in enumerate(st.layers[: len(layers)]):
                if ls is None:
                    continue
                layer = layers[idx]
                if ls.plan.kind in MOVABLE:
                    self._observe_if_moved(ls, layer, st.owner_req)
                    continue
                if not ls.plan.static or getattr(layer, "keys", None) is None:
                    continue
                n = static_filled(layer, (), {})
                if n is not None:
                    self.ledger.slots.fill([site.slot for site in ls.sites], n)

    def _observe_if_moved(self, ls: LayerState, layer: Any, owner: RequestInfo) -> None:
        """A layer whose tensors were replaced outside ``update`` - ``layer.keys = layer.keys.to(...)`` (a move to
        another device or dtype), an offloaded cache's ``offload()``/``prefetch()`` - holds storages the ledger has
        not seen: they are observed for the cache's owner (O(1) per layer; the old storages' entries go on with
        them, or were released when they were freed)."""
        keys = getattr(layer, "keys", None)
        if keys is None or not hasattr(keys, "untyped_storage"):
            return
        if keys.untyped_storage().data_ptr() != self.ledger.slots.key(ls.sites[0].slot):
            self.ledger.observe_kv(keys, getattr(layer, "values", None), ls.sites, owner)

    def cache_ref(self, rec: Record) -> weakref.ref[Any] | None:
        """The weak reference to the live cache whose slot ``rec`` fills, when this tracker knows it."""
        slot = rec.slot
        if isinstance(slot, tuple) and slot and isinstance(slot[0], int):
            st = self.caches.get(slot[0])
            if st is not None:
                return st.ref
        return None

    def chain_seeds(self, records: Sequence[Record]) -> tuple[dict[Any, Any], dict[Any, list[str]]]:
        """For orphaned entries still held by a live cache this tracker knows: storage key -> the cache object
        (where the holder-chain search can start, four levels and a heap scan cheaper), and the rendered
        steps from the cache down to the tensor."""
        seeds: dict[Any, Any] = {}
        suffixes: dict[Any, list[str]] = {}
        for rec in records:
            slot = rec.slot
            if rec.state is not EntryState.ORPHANED or not isinstance(slot, tuple) or len(slot) != 3:
                continue
            st = self.caches.get(slot[0])
            cache = st.ref() if st is not None else None
            if cache is None or st is None or st.generic:
                continue
            tail = _layer_tail(cache, st, slot[1], rec)
            if tail is None:
                continue
            seeds[rec.key] = cache
            shape = "×".join(str(x) for x in rec.shape)
            suffixes[rec.key] = [f"{type(cache).__name__}.layers", f"list[{slot[1]}]", *tail,
                                 f"Tensor[{shape}] {rec.dtype.replace('torch.', '')}"]
        return seeds, suffixes

    def note_result(self, info: RequestInfo, result: object) -> None:
        """What request ``info`` returned to the program (a generate output, which holds its cache), remembered
        by weak reference (the latest `_MAX_RESULTS`) as a hint for the holder search. A tensor or an object
        without weak references is not remembered."""
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(result, torch.Tensor):  # a tensor of tokens holds no cache
            return
        try:
            ref = weakref.ref(result)
        except TypeError:
            return
        self._results[info.request_id] = ref
        while len(self._results) > _MAX_RESULTS:
            self._results.popitem(last=False)

    def chain_hints(self, records: Sequence[Record]) -> list[Any]:
        """The live results of the requests that own ``records``: objects likely to hold their caches."""
        out: list[Any] = []
        seen: set[str | None] = set()
        for rec in records:
            rid = rec.request_id
            if rid in seen:
                continue
            seen.add(rid)
            ref = self._results.get(rid) if rid is not None else None
            obj = ref() if ref is not None else None
            if obj is not None:
                out.append(obj)
        return out

    # ------------------------------------------------------------------ copies
    def note_copy(self, original: object, dup: object) -> bool:
        """``copy.deepcopy(original)`` returned ``dup`` (called by the ``Cache.__deepcopy__`` of `hf.instrument`):
        if this tracker knows ``original``, the copy is remembered weakly, as KV of the current request (a copy
        made inside one) or of the request that owns the original, and True is returned. A copy is looked at when
        the next request ends or before a snapshot: one that has been updated since is tracked as any cache is;
        one never updated (a snapshot kept for later) gets its own entries then, owned by that request - so a
        kept copy of an ended request's cache is that request's KV, retained."""
        st = self.caches.get(id(original))
        if st is None or st.ref() is not original or st.generic:
            return False
        owner = self._current_request() or st.owner_req
        if owner is not None:
            try:
                self._copies.append((weakref.ref(dup), owner, st.label))
            except TypeError:  # a copy without weak references (a subclass with __slots__): not followed
                pass
        return True

    def _adopt_copies(self) -> None:
        while self._copies:
            ref, owner, source = self._copies.popleft()
            cache = ref()
            if cache is None:
                continue
            st = self.caches.get(id(cache))
            if st is not None and st.ref() is cache:
                continue  # updated since it was made: tracked the usual way
            st = self._new_cache(cache)
            if st.generic:
                continue
            st.owner, st.owner_req, st.init_done = owner.request_id, owner, True
            self._observe_layers(cache, st, owner)
            self.ledger.notes.cache_event("init", cache=st.label, request=owner, detail=f"a deep copy of {source}",
                                          nbytes=self.ledger.slots.nbytes(st.slots()))

    def _observe_layers(self, cache: Cache, st: CacheState, owner: RequestInfo) -> None:
        """Observe every layer's keys and values of ``cache`` as they are now, for ``owner`` (O(layers))."""
        layers = getattr(cache, "layers", None)
        if not isinstance(layers, list):
            return
        for idx, layer in enumerate(layers[: len(st.layers)]):
            ls = st.layers[idx]
            keys = getattr(layer, "keys", None)
            if ls is None or ls.plan.skip_reason or keys is None or not hasattr(keys, "untyped_storage"):
                continue
            static = ls.plan.static
            update = Update(static_filled(layer, (), {}) if static else None,
                            int(layer.max_cache_len) if static else None)
            self.ledger.observe_kv(keys, getattr(layer, "values", None), ls.sites, owner, update)

    # ------------------------------------------------------------------ crop / reset
    def on_evict(self, cache: Cache, detail: str) -> None:
        """After ``cache.crop()``/``reset()``: an evict event, and the layers re-observed (O(layers))."""
        if self._dead:
            self._process_dead()
        st = self.caches.get(id(cache))
        if st is None or st.ref() is not cache:
            return
        self.ledger.notes.cache_event("evict", cache=st.label, request=st.owner_req, detail=detail,
                                      nbytes=self.ledger.slots.nbytes(st.slots()))
        if st.following:  # sampled: observed by each layer's own observer, and no longer followed
            self._refresh(st)
        elif st.owner_req is not None:
            self._observe_layers(cache, st, st.owner_req)

    def on_reshape(self, cache: Cache) -> None:
        """After ``reorder_cache`` (beam search, every step) and the batch repeat/select of contrastive and
        assisted decoding: every layer holds new tensors. A followed cache needs nothing (the next observation
        finds what its slots hold, as after a ``torch.cat``); otherwise the layers are observed again, so the
        tensors the cache ends with are the ones recorded, not the ones the reorder dropped."""
        if self._dead:
            self._process_dead()
        st = self.caches.get(id(cache))
        if st is None or st.ref() is not cache or st.following or st.owner_req is None:
            return
        self._observe_layers(cache, st, st.owner_req)

    def summary(self) -> dict[str, Any]:
        if self._dead:
            self._process_dead()
        cold = self.lifecycle.cold_ttft
        return {
            "caches_live": len(self.caches),
            "updates": self.updates,
            "skipped_layers": dict(self.skipped),
            "notes": dict(self.notes),
            "unknown_classes": dict(self.unknown),
            "cold_first_token_s_median": round(statistics.median(cold), 6) if cold else None,
            "not_seen": not_seen(sampled=self.sampler is not None),
        }


#: What the ledger cannot see, said in every report (summary.hf.not_seen) so a clean result is read for what it is.
NOT_SEEN_COPIES = ("KV copied into a new tensor (clone(), torch.cat, .to() another dtype or device, .contiguous() of "
                   "a non-contiguous tensor, copy.deepcopy of one tensor, copy_ into the program's own buffer) is not "
                   "followed: following copies means intercepting every torch call of the program (docs/notes/"
                   "transformers.md); views, slices, detach() and deep copies of whole caches are followed")
NOT_SEEN_SKIPPED = ("with decode-step sampling (decode_stride > 1), a tensor kept only from a skipped decode step is "
                    "not seen (the cache itself, the prefill, first and last steps always are); decode_stride=1 "
                    "observes every step")


def not_seen(*, sampled: bool) -> list[str]:
    """The limits of this audit that apply to this tracker's settings."""
    return [NOT_SEEN_COPIES, *([NOT_SEEN_SKIPPED] if sampled else [])]


def _layer_tail(cache: Cache, st: CacheState, idx: int, rec: Record) -> list[str] | None:
    """The rendered steps from layer ``idx`` of ``cache`` to ``rec``'s tensor, if the layer still holds ``rec``'s
    storage."""
    try:
        layer = cache.layers[idx]
        ls = st.layers[idx]
        if ls is None:
            return None
        if ls.plan.kind == "fp8":
            attr = "_quantized_keys" if rec.kind == "k" else "_quantized_values"
            t = getattr(layer, attr)[0]
            tail = [f"{type(layer).__name__}.{attr}", "tuple[0]"]
        else:
            attr = "keys" if rec.kind == "k" else "values"
            t = getattr(layer, attr)
            tail = [f"{type(layer).__name__}.{attr}"]
        if t is None or t.untyped_storage().data_ptr() != rec.key:
            return None
    except Exception:
        return None
    return tail
