"""One small observer per cache-layer layout, and the table that picks it by layer kind (`hf.layers`).

After each ``Cache.update`` the tracker calls the updated layer's observer, once per layer per step: it reads
the few attributes its layout keeps the KV in and hands the storages to the ledger in O(1), returning a stored
tensor that requires grad (KVG101 evidence) if it saw one. The observer table: docs/design/hf.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple
from weakref import ref

from kvguardian.core.ledger import NO_FILL, NO_GRAD, EntrySite, Ledger, RequestInfo, Update
from kvguardian.runtime.hf.layers import LayerPlan, generic_tensors, iter_plain_tensors, static_filled

__all__ = ["OBSERVERS", "CacheUpdate", "LayerState", "ObserveEnv", "Observer"]


class CacheUpdate(NamedTuple):
    """One ``cache.update(key_states, value_states, layer_idx, *args, **kwargs)`` that returned ``out``."""

    cache: Any
    layer_idx: int
    # the new tokens' keys; for a deferred update a `KeyInfo` (their shape, dtype, device) on the cache's first
    # update in its forward, None on the later ones (a request enters a cache at its first update)
    key_states: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any  # what update() returned; kept only for caches without a `layers` list (the generic path)


class ObserveEnv(NamedTuple):
    """What every observer uses, bound once per tracker (attribute chains cost as much as the calls here)."""

    observe_kv: Callable[[Any, Any, tuple[EntrySite, EntrySite], RequestInfo | None, Update], bool]  # Ledger's
    observe: Callable[[Any, EntrySite, RequestInfo | None], Any]  # Ledger.observe
    grad_enabled: Callable[[], bool]  # torch.is_grad_enabled, or a constant False without torch
    touch_kv: Callable[[tuple[EntrySite, EntrySite], RequestInfo | None, Update], bool]  # Ledger.slots.touch

    @classmethod
    def of(cls, ledger: Ledger, grad_enabled: Callable[[], bool]) -> ObserveEnv:
        return cls(ledger.observe_kv, ledger.observe, grad_enabled, ledger.slots.touch)


class LayerState:
    """What the tracker knows about one layer of one cache: its plan, its observer, where its entries go."""

    __slots__ = ("cls", "extra", "index", "marker", "observe", "plan", "same", "sites")

    def __init__(self, plan: LayerPlan, index: int, sites: tuple[EntrySite, EntrySite]) -> None:
        self.plan = plan
        self.cls = plan.cls  # the layer class it was planned for: another class is planned again
        self.index = index
        self.observe: Observer = OBSERVERS[plan.kind]
        self.sites = sites  # keys' and values' sites: slot (cache id, layer, "k"/"v"), source = the layer class
        self.extra: dict[Any, EntrySite] = {}  # sites of the layer's other tensors (quantized states, generic)
        self.marker: int | None = None  # identity of the quantized states last observed
        # weak references to the keys and values tensors a static layer's entries were last observed from
        # (tensor objects: the same objects at the next step are the same storages, not read again)
        self.same: tuple[Any, Any] | None = None

    def site(self, kind: str, slot_tail: Any) -> EntrySite:
        """The site of another tensor of this layer: ``kind``, slot (cache id, layer, ``slot_tail``...)."""
        site = self.extra.get(slot_tail)
        if site is None:
            k = self.sites[0]
            cid = k.slot[0] if isinstance(k.slot, tuple) else None
            tail = slot_tail if isinstance(slot_tail, tuple) else (slot_tail,)
            site = self.extra[slot_tail] = EntrySite(kind, self.index, k.source, (cid, self.index, *tail), k.role,
                                                     k.cache)
        return site


#: (env, layer state, the layer object, the request, the update) -> a stored tensor that requires grad, or None
Observer = Callable[[ObserveEnv, LayerState, Any, RequestInfo, CacheUpdate], Any]


def _grad_tensor(keys: Any, values: Any) -> Any:
    """The one of ``keys``/``values`` that requires grad (keys first)."""
    if keys is not None and keys.requires_grad:
        return keys
    if values is not None and values.requires_grad:
        return values
    return None


def observe_kv(env: ObserveEnv, ls: LayerState, layer: Any, req: RequestInfo, u: CacheUpdate) -> Any:
    """DynamicLayer and friends: a new ``torch.cat`` storage every step in ``keys``/``values``."""
    keys = layer.keys
    if keys is None:
        return None
    values = layer.values
    grad = env.observe_kv(keys, values, ls.sites, req, NO_FILL if env.grad_enabled() else NO_GRAD)
    return _grad_tensor(keys, values) if grad else None


def observe_static(env: ObserveEnv, ls: LayerState, layer: Any, req: RequestInfo, u: CacheUpdate) -> Any:
    """StaticLayer and friends: preallocated ``keys``/``values`` written in place, filled tokens counted."""
    keys = layer.keys
    if keys is None:
        return None
    values = layer.values
    # filled tokens only where it is free (a Python int counter); tensor counters are read at sync
    n = getattr(layer, "cumulative_length_int", None)
    if n is None and ls.plan.kind != "static_sliding" and not hasattr(layer, "cumulative_length"):
        n = static_filled(layer, u.args, u.kwargs)  # 5.0–5.4: from cache_position
    elif n is None:
        c = layer.cumulative_length
        n = c if type(c) is int else None
    cap = layer.max_cache_len
    grad_on = env.grad_enabled()
    update = Update(min(n, cap) if n is not None else None, cap, grad_on)
    same = ls.same
    # the tensors observed last, written in place: with grad mode off nothing about them can have changed that
    # the ledger reads (storage, shape, requires_grad), so only the fill, the time and the append are recorded
    if (same is not None and not grad_on and same[0]() is keys and same[1]() is values
            and env.touch_kv(ls.sites, req, update)):
        return None
    grad = env.observe_kv(keys, values, ls.sites, req, update)
    if values is not None and not grad_on:
        ls.same = (ref(keys), ref(values))
    return _grad_tensor(keys, values) if grad else None


def observe_fp8(env: ObserveEnv, ls: LayerState, layer: Any, req: RequestInfo, u: CacheUpdate) -> Any:
    """Fp8QuantizedLayer: ``(fp8 tensor, scale)`` pairs, a new storage every step."""
    qk = getattr(layer, "_quantized_keys", None)
    qv = getattr(layer, "_quantized_values", None)
    if qk is None:
        return None
    keys = qk[0]
    values = qv[0] if qv is not None else None
    grad = env.observe_kv(keys, values, ls.sites, req, NO_FILL if env.grad_enabled() else NO_GRAD)
    return _grad_tensor(keys, values) if grad else None


def observe_quantized(env: ObserveEnv, ls: LayerState, layer: Any, req: RequestInfo, u: CacheUpdate) -> Any:
    """Quanto/HQQ/QuantizedLayer: the original-precision residual every step, and the backend's quantized
    states (a QTensor's inner tensors, hqq's ``(tensor, meta)``) only when they change (every
    ``residual_length`` tokens)."""
    keys = getattr(layer, "keys", None)
    values = getattr(layer, "values", None)
    if keys is not None and keys.numel():
        env.observe_kv(keys, values, ls.sites, req, NO_FILL)
    qk = getattr(layer, "_quantized_keys", None)
    qv = getattr(layer, "_quantized_values", None)
    marker = id(qk) ^ (id(qv) << 1)
    if qk is not None and ls.marker != marker:  # re-quantized: new storages
        ls.marker = marker
        for kind, state in (("qk", qk), ("qv", qv)):
            for j, t in enumerate(iter_plain_tensors(state)):
                env.observe(t, ls.site(kind, (kind, j)), req)
    return keys if keys is not None and keys.requires_grad else None


def observe_generic(env: ObserveEnv, ls: LayerState, layer: Any, req: RequestInfo, u: CacheUpdate) -> Any:
    """An unknown layer class: every tensor attribute (audited, with a KVG107 warning)."""
    first = None
    for name, t in generic_tensors(layer):
        env.observe(t, ls.site(name, name), req)
        if first is None:
            first = t
    return first if first is not None and first.requires_grad else None


def observe_nothing(env: ObserveEnv, ls: LayerState, layer: Any, req: RequestInfo, u: CacheUpdate) -> Any:
    """Linear-attention and dummy layers: a fixed-size state or nothing, no per-token KV."""
    return None


#: layer kind (`hf.layers.KNOWN_LAYERS`) -> its observer
OBSERVERS: dict[str, Observer] = {
    "dynamic": observe_kv, "sliding": observe_kv, "hybrid": observe_kv,
    "static": observe_static, "static_sliding": observe_static, "hybrid_static": observe_static,
    "fp8": observe_fp8, "quantized": observe_quantized, "generic": observe_generic,
    "linear": observe_nothing, "dummy": observe_nothing,
}
