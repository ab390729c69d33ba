"""Per-guard state of the transformers caches it has seen: which request owns each cache, what each layer
stores (`hf.layers`), cache-level lifecycle events (init / hit / evict / release), first-token latency and
the cross-request reuse window.

Called from the ``Cache.update`` wrapper once per layer per step: everything there is O(1) per layer
(dictionary lookups, attribute reads, the ledger's paired observe); nothing walks the cache.
"""

from __future__ import annotations

import itertools
import statistics
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from kvguardian import _faults
from kvguardian.hf.layers import LayerPlan, generic_tensors, iter_plain_tensors, plan_for, static_filled
from kvguardian.ledger import RequestInfo
from kvguardian.reuse import ReuseWindow

if TYPE_CHECKING:
    from kvguardian.guard import Guard

__all__ = ["CacheState", "HFTracker"]

_labels = itertools.count(1)


class CacheState:
    """What the tracker knows about one live cache object (held by weak reference)."""

    __slots__ = (
        "__weakref__",
        "cid",
        "fields",
        "first_layer",
        "generic",
        "init_done",
        "label",
        "layer_count",
        "manual",
        "owner",
        "owner_req",
        "plans",
        "qids",
        "ref",
        "role",
        "rs",
        "slots",
    )

    def __init__(self, cache: Any, label: str, role: str | None, on_dead: Any) -> None:
        self.cid = id(cache)
        self.ref = weakref.ref(cache, on_dead)
        self.label = label  # "DynamicCache#3", "EncoderDecoderCache#1.cross"
        self.role = role  # "self" / "cross" for encoder-decoder sub-caches
        self.plans: list[LayerPlan | None] = []  # by layer index, filled lazily
        self.slots: list[tuple[Any, Any]] = []
        self.qids: dict[int, int] = {}  # layer -> id() of the quantized state last observed
        self.owner: str | None = None  # request id of the last request that updated it
        self.owner_req: RequestInfo | None = None
        self.rs: _ReqState | None = None
        self.manual: RequestInfo | None = None  # open implicit request of a manually driven cache
        self.init_done = False
        self.generic = not isinstance(getattr(cache, "layers", None), list)
        self.first_layer: int | None = None
        self.fields: dict[str, Any] = {}  # init fields (shape, dtype, device) until the init event is emitted
        self.layer_count = 0

    def __repr__(self) -> str:
        return f"<CacheState {self.label}>"


class _ReqState:
    """Per active request: first-token latency and what it reused."""

    __slots__ = ("caches", "first_layer", "first_st", "hits", "inits", "prefill", "req", "reused", "start", "ttft")

    def __init__(self, req: RequestInfo, now: float) -> None:
        self.req = req
        self.start = min(req.started, now)
        self.first_st: CacheState | None = None
        self.first_layer = -1
        self.ttft: float | None = None
        self.caches = 0
        self.reused = 0
        self.prefill = 0
        self.hits: list[tuple[CacheState, str | None, float]] = []  # (cache, previous owner, hit ratio)
        self.inits: list[CacheState] = []


class HFTracker:
    """The transformers source of one guard."""

    def __init__(self, guard: Guard, *, reuse_capacity: int = 4_096) -> None:
        self.guard = guard
        self.ledger = guard.ledger
        self._clock = guard.ledger._clock
        self.caches: dict[int, CacheState] = {}
        self._dead: deque[CacheState] = deque()
        self._reqs: dict[str, _ReqState] = {}
        self._manual_open: dict[str, CacheState] = {}
        self._manual_ids = itertools.count(1)
        self._by_ref: dict[int, CacheState] = {}  # id(weakref to a cache) -> its state
        self._on_dead = self._make_on_dead()
        self.cold_ttft: deque[float] = deque(maxlen=32)
        self.reuse = ReuseWindow(reuse_capacity, clock=self._clock)
        self.unknown: dict[str, str] = {}  # class name -> why it went through the generic path
        self.skipped: dict[str, str] = {}  # layer class -> reason it holds no KV
        self.notes: dict[str, str] = {}
        self.updates = 0
        # the start of the forward whose deferred updates are being observed (None: updates observed as they
        # happen): the time a request starts and its first token is out are measured from forward starts
        self._event_time: float | None = None
        # bound once: attribute chains cost as much as the calls on the per-layer path
        self._current_request = guard._current.get
        self._observe_kv = self.ledger.observe_kv
        try:
            from torch import is_grad_enabled
        except ImportError:  # no torch: nothing can require grad
            def is_grad_enabled() -> bool:
                return False
        # grad mode off (inference_mode, no_grad): nothing an update stores requires grad, so the ledger does not
        # read requires_grad where an entry continues
        self._grad_enabled = is_grad_enabled

    def _now(self) -> float:
        """The time of the update being observed: its forward's start when observed after the forward."""
        t = self._event_time
        return t if t is not None else self._clock()

    # ------------------------------------------------------------------ the hot path
    def on_update(self, cache: Any, layer_idx: int, key_states: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any], out: Any) -> None:
        """After ``cache.update(key_states, value_states, layer_idx, *args, **kwargs)`` returned ``out``."""
        if _faults.FAULTS:
            _faults.maybe_fail("cache.update")
        self.updates += 1
        if self._dead:
            self._process_dead()
        st = self.caches.get(id(cache))
        if st is None or st.ref() is not cache:
            st = self._new_cache(cache)
        req = self._current_request()
        if req is None:
            req = st.manual
            if req is None or req.ended is not None:
                req = self._begin_manual(st)
        if st.owner_req is not req:
            self._enter(st, req, cache, layer_idx, key_states, args, kwargs, out)
        rs = st.rs
        if rs is not None and rs.ttft is None:
            if rs.first_st is None:
                rs.first_st, rs.first_layer = st, layer_idx
            elif rs.first_st is st and rs.first_layer == layer_idx:
                rs.ttft = self._now() - rs.start  # this layer's second update: the first token is out
                self._flush_request_events(rs)
        if st.generic:
            self._observe_returned(st, layer_idx, req, out)
            return
        layers = cache.layers
        if layer_idx >= len(st.plans):
            self._extend(st, len(layers))
        plan = st.plans[layer_idx]
        layer = layers[layer_idx]
        if plan is None or type(layer) is not plan.cls:
            plan = self._plan_layer(st, layer_idx, layer)
        path = plan.path
        if path == "kv":
            keys = layer.keys
            if keys is None:
                return
            values = layer.values
            grad = self._observe_kv(keys, values, layer_idx, req, plan.cls_name, st.slots[layer_idx], None, None,
                                    st.role, st.label, self._grad_enabled())
        elif path == "static":
            keys = layer.keys
            if keys is None:
                return
            values = layer.values
            # filled tokens only where it is free (a Python int counter); tensor counters are read at refresh
            n = getattr(layer, "cumulative_length_int", None)
            if n is None and plan.kind != "static_sliding" and not hasattr(layer, "cumulative_length"):
                n = static_filled(layer, args, kwargs)  # 5.0–5.4: from cache_position
            elif n is None:
                c = layer.cumulative_length
                n = c if type(c) is int else None
            cap = layer.max_cache_len
            grad = self._observe_kv(keys, values, layer_idx, req, plan.cls_name, st.slots[layer_idx],
                                    min(n, cap) if n is not None else None, cap, st.role, st.label,
                                    self._grad_enabled())
        elif path == "fp8":
            qk = getattr(layer, "_quantized_keys", None)
            qv = getattr(layer, "_quantized_values", None)
            if qk is None:
                return
            keys = qk[0]
            values = qv[0] if qv is not None else None
            grad = self._observe_kv(keys, values, layer_idx, req, plan.cls_name, st.slots[layer_idx], None, None,
                                    st.role, st.label, self._grad_enabled())
        elif path == "quantized":
            keys = self._observe_quantized(st, layer, layer_idx, req, plan)
            values = None
            grad = keys is not None and keys.requires_grad
        elif path == "generic":
            keys = self._observe_generic(st, layer, layer_idx, req, plan)
            values = None
            grad = keys is not None and keys.requires_grad
        else:  # linear / dummy: no per-token KV
            return
        if grad:
            guard = self.guard
            if keys is not None and keys.requires_grad:
                guard._note_grad(keys, layer_idx)
            elif values is not None and values.requires_grad:
                guard._note_grad(values, layer_idx)

    def refresh(self) -> None:
        """Bring the filled-token counts of static layers up to date (O(layers) per live cache): done before
        a snapshot, not on every step, because reading a tensor counter costs more than the rest of a step's
        bookkeeping."""
        if self._dead:
            self._process_dead()
        for st in list(self.caches.values()):
            cache = st.ref()
            if cache is None or st.generic or st.owner_req is None:
                continue
            layers = cache.layers
            for idx, plan in enumerate(st.plans[: len(layers)]):
                if plan is None or not plan.static:
                    continue
                layer = layers[idx]
                if getattr(layer, "keys", None) is None:
                    continue
                n = static_filled(layer, (), {})
                if n is None:
                    continue
                slots = self.ledger._slots
                for s in st.slots[idx] or ():
                    rec = slots.get(s)
                    if rec is not None:
                        rec.filled_tokens = n

    # ------------------------------------------------------------------ cache states
    def _new_cache(self, cache: Any) -> CacheState:
        from kvguardian.hf.instrument import cache_role

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
        self.caches[st.cid] = st
        self._by_ref[id(st.ref)] = st
        layers = getattr(cache, "layers", None)
        if isinstance(layers, list):  # classify every layer once (O(layers)): skipped ones get their reason now
            self._extend(st, len(layers))
            for i, layer in enumerate(layers):
                self._plan_layer(st, i, layer)
        if st.generic:
            cls = f"{type(cache).__module__}.{type(cache).__qualname__}"
            self.unknown.setdefault(cls, "the cache has no `layers` list: the tensors returned by update() are "
                                         "audited per layer")
        return st

    def _make_on_dead(self) -> Any:
        dead = self._dead
        by_ref = self._by_ref

        def on_dead(ref: Any) -> None:  # inside a deallocation: only queue it
            st = by_ref.pop(id(ref), None)
            if st is not None:
                dead.append(st)

        return on_dead

    def _process_dead(self) -> None:
        while self._dead:
            st = self._dead.popleft()
            if self.caches.get(st.cid) is st:
                del self.caches[st.cid]
            if st.init_done or st.owner is not None:
                self.ledger.emit_cache_event("release", cache=st.label, request=st.owner_req, detail="freed")
            if st.manual is not None and st.manual.ended is None:
                self._end_manual(st)

    def _extend(self, st: CacheState, n: int) -> None:
        while len(st.plans) < n:
            i = len(st.plans)
            st.plans.append(None)
            st.slots.append(((st.cid, i, "k"), (st.cid, i, "v")))
        st.layer_count = n

    def _plan_layer(self, st: CacheState, idx: int, layer: Any) -> LayerPlan:
        plan = plan_for(layer)
        st.plans[idx] = plan
        if plan.skip_reason:
            self.skipped.setdefault(plan.cls_name, plan.skip_reason)
        if plan.note:
            self.notes.setdefault(plan.cls_name, plan.note)
        if not plan.known:
            self.unknown.setdefault(plan.cls_name, plan.note or "unknown layer class")
        return plan

    def classify(self, cache: Any) -> dict[str, Any]:
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

    # ------------------------------------------------------------------ observers for the rarer layouts
    def _observe_quantized(self, st: CacheState, layer: Any, idx: int, req: RequestInfo,
                           plan: LayerPlan) -> Any:
        ledger = self.ledger
        keys = getattr(layer, "keys", None)
        values = getattr(layer, "values", None)
        if keys is not None and keys.numel():
            ledger.observe_pair(keys, values, layer=idx, request=req, source=plan.cls_name,
                                slots=st.slots[idx], role=st.role, cache=st.label)
        qk = getattr(layer, "_quantized_keys", None)
        qv = getattr(layer, "_quantized_values", None)
        marker = id(qk) ^ (id(qv) << 1)
        if qk is not None and st.qids.get(idx) != marker:  # re-quantized: new storages (every residual_length)
            st.qids[idx] = marker
            for kind, state in (("qk", qk), ("qv", qv)):
                for j, t in enumerate(iter_plain_tensors(state)):
                    ledger.observe_tensor(t, kind=kind, layer=idx, request=req, source=plan.cls_name,
                                          slot=(st.cid, idx, kind, j), role=st.role, cache=st.label)
        return keys

    def _observe_generic(self, st: CacheState, layer: Any, idx: int, req: RequestInfo,
                         plan: LayerPlan) -> Any:
        first = None
        for name, t in generic_tensors(layer):
            self.ledger.observe_tensor(t, kind=name, layer=idx, request=req, source=plan.cls_name,
                                       slot=(st.cid, idx, name), role=st.role, cache=st.label)
            if first is None:
                first = t
        return first

    def _observe_returned(self, st: CacheState, idx: int, req: RequestInfo, out: Any) -> None:
        import torch

        if not isinstance(out, (tuple, list)):
            return
        for kind, t in zip(("k", "v"), out):
            if isinstance(t, torch.Tensor):
                self.ledger.observe_tensor(t, kind=kind, layer=idx, request=req, source=type(st).__name__,
                                           slot=(st.cid, idx, kind), role=st.role, cache=st.label)
                if t.requires_grad:
                    self.guard._note_grad(t, idx)

    # ------------------------------------------------------------------ requests
    def _enter(self, st: CacheState, req: RequestInfo, cache: Any, idx: int, key_states: Any,
               args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """The first update of ``st`` by request ``req``: a cold start (init) or a hit (reuse)."""
        if self.guard.on_kv_growth is not None:  # the pre-OOM guard samples where a request's KV starts to grow
            self.guard.on_kv_growth()
        previous = st.owner
        st.owner = req.request_id
        st.owner_req = req
        rs = self._reqs.get(req.request_id)
        if rs is None:
            rs = self._reqs[req.request_id] = _ReqState(req, self._now())
        st.rs = rs
        rs.caches += 1
        new = int(key_states.shape[-2]) if hasattr(key_states, "shape") and key_states.dim() >= 2 else 0
        before = self._tokens_before(st, cache, idx, new, args, kwargs, out)
        if st.role == "cross":  # cross-attention KV is the encoder's output, not a prefix of this request
            before = 0
        if before > 0:
            rs.reused += before
            rs.prefill += new
            rs.hits.append((st, previous, before / (before + new) if before + new else 0.0))
        else:
            rs.prefill += new
            if not st.init_done:
                st.fields = {
                    "shape": tuple(int(s) for s in key_states.shape) if hasattr(key_states, "shape") else None,
                    "dtype": str(key_states.dtype) if hasattr(key_states, "dtype") else None,
                    "device": str(key_states.device) if hasattr(key_states, "device") else None,
                    "layer": idx,
                }
                rs.inits.append(st)
        st.init_done = True

    def _tokens_before(self, st: CacheState, cache: Any, idx: int, new: int, args: tuple[Any, ...],
                       kwargs: dict[str, Any], out: Any) -> int:
        """Tokens the cache held in this layer before this update (O(1))."""
        try:
            if st.generic:
                t = out[0] if isinstance(out, (tuple, list)) else None
                return max(0, int(t.shape[-2]) - new) if t is not None else 0
            layer = cache.layers[idx]
            total: Any = getattr(layer, "cumulative_length_int", None)
            if total is None:
                total = getattr(layer, "cumulative_length", None)
            if total is not None:
                return max(0, int(total) - new)
            if getattr(layer, "max_cache_len", None) is not None:  # 5.0–5.4 static: first written position
                ck = args[0] if args else kwargs.get("cache_kwargs")
                cp = ck.get("cache_position") if isinstance(ck, dict) else None
                return int(cp[0]) if cp is not None and cp.numel() else 0
            keys = getattr(layer, "keys", None)
            if keys is not None and keys.dim() >= 2:
                return max(0, int(keys.shape[-2]) - new)
        except Exception:
            return 0
        return 0

    def _flush_request_events(self, rs: _ReqState) -> None:
        req = rs.req
        ttft = rs.ttft
        for st in rs.inits:
            f = st.fields
            self.ledger.emit_cache_event(
                "init", cache=st.label, request=req, nbytes=self._cache_bytes(st), layer=f.get("layer"),
                shape=f.get("shape"), dtype=f.get("dtype"), device=f.get("device"), first_token_s=ttft,
                detail=f"{st.layer_count} layers" if st.layer_count else None,
            )
            st.fields = {}
        cold = statistics.median(self.cold_ttft) if self.cold_ttft else None
        for st, previous, ratio in rs.hits:
            self.ledger.emit_cache_event(
                "hit", cache=st.label, request=req, nbytes=self._cache_bytes(st), hit_ratio=round(ratio, 6),
                first_token_s=ttft,
                latency_delta=(ttft - cold) if ttft is not None and cold is not None else None,
                detail=f"reused from {previous}" if previous else "prefilled before this request (a copy)",
            )
        if not rs.hits and ttft is not None and rs.caches:
            self.cold_ttft.append(ttft)
        rs.inits = []
        rs.hits = []

    def _cache_bytes(self, st: CacheState) -> int:
        total = 0
        slots = self.ledger._slots
        for pair in st.slots:
            if pair is None:
                continue
            for s in pair:
                rec = slots.get(s)
                if rec is not None:
                    total += rec.storage_bytes
        return total

    def request_ended(self, info: RequestInfo) -> None:
        """After the ledger ended ``info``: flush its pending events and add its reuse sample."""
        rs = self._reqs.pop(info.request_id, None)
        if rs is None:
            return
        if rs.ttft is None:
            rs.ttft = (info.ended if info.ended is not None else self._clock()) - rs.start
            self._flush_request_events(rs)
        elif rs.inits or rs.hits:
            self._flush_request_events(rs)
        if rs.caches:
            self.reuse.add(rs.reused > 0, rs.reused, rs.prefill, ts=info.ended)
        for st in list(self.caches.values()):
            if st.owner_req is info:
                st.rs = None

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
        self.ledger.end_request(info.request_id)
        self.request_ended(info)
        self.guard._after_request_end(info)

    def end_manual(self) -> None:
        """End every open manually-driven-cache request (a new request is starting, or the final check)."""
        for st in list(self._manual_open.values()):
            self._end_manual(st)

    def on_evict(self, cache: Any, detail: str) -> None:
        """After ``cache.crop()``/``reset()``: an evict event, and the layers re-observed (O(layers))."""
        if self._dead:
            self._process_dead()
        st = self.caches.get(id(cache))
        if st is None or st.ref() is not cache:
            return
        self.ledger.emit_cache_event("evict", cache=st.label, request=st.owner_req, detail=detail,
                                     nbytes=self._cache_bytes(st))
        layers = getattr(cache, "layers", None)
        if not isinstance(layers, list) or st.owner_req is None:
            return
        for idx, layer in enumerate(layers[: len(st.plans)]):
            plan = st.plans[idx]
            keys = getattr(layer, "keys", None)
            if plan is None or plan.skip_reason or keys is None or not hasattr(keys, "untyped_storage"):
                continue
            filled = static_filled(layer, (), {}) if plan.static else None
            self.ledger.observe_pair(keys, getattr(layer, "values", None), layer=idx, request=st.owner_req,
                                     source=plan.cls_name, slots=st.slots[idx], filled_tokens=filled,
                                     capacity_tokens=int(layer.max_cache_len) if plan.static else None,
                                     role=st.role, cache=st.label)

    def chain_seeds(self, records: Any) -> tuple[dict[Any, Any], dict[Any, list[str]]]:
        """For orphaned entries still held by a live cache this tracker knows: storage key -> the cache object
        (where the holder-chain search can start, four levels and a heap scan cheaper), and the rendered
        steps from the cache down to the tensor."""
        from kvguardian.ledger import EntryState

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
            idx = slot[1]
            try:
                layer = cache.layers[idx]
                plan = st.plans[idx]
                if plan is None:
                    continue
                if plan.kind == "fp8":
                    attr = "_quantized_keys" if rec.kind == "k" else "_quantized_values"
                    t = getattr(layer, attr)[0]
                    tail = [f"{type(layer).__name__}.{attr}", "tuple[0]"]
                else:
                    attr = "keys" if rec.kind == "k" else "values"
                    t = getattr(layer, attr)
                    tail = [f"{type(layer).__name__}.{attr}"]
                if t is None or t.untyped_storage().data_ptr() != rec.key:
                    continue
            except Exception:
                continue
            seeds[rec.key] = cache
            shape = "×".join(str(x) for x in rec.shape)
            suffixes[rec.key] = [f"{type(cache).__name__}.layers", f"list[{idx}]", *tail,
                                 f"Tensor[{shape}] {rec.dtype.replace('torch.', '')}"]
        return seeds, suffixes

    def summary(self) -> dict[str, Any]:
        if self._dead:
            self._process_dead()
        return {
            "caches_live": len(self.caches),
            "updates": self.updates,
            "skipped_layers": dict(self.skipped),
            "notes": dict(self.notes),
            "unknown_classes": dict(self.unknown),
            "cold_first_token_s_median": round(statistics.median(self.cold_ttft), 6) if self.cold_ttft else None,
        }
