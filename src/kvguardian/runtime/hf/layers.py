"""What each transformers cache layer stores, and how to observe it in O(1) per update.

A layer class is classified once, by the names in its MRO (so every 5.x release and user subclasses work),
into a `LayerPlan` of kind dynamic, sliding, static, static_sliding, quantized, fp8, hybrid, linear/dummy
(no per-token KV) or generic (every tensor attribute, with a KVG107 warning). What each kind observes:
docs/design/hf.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["LayerPlan", "iter_plain_tensors", "plan_for", "static_filled"]

#: layer class name -> kind. Checked along the MRO, most specific first.
KNOWN_LAYERS: dict[str, str] = {
    "LinearAttentionAndFullAttentionLayer": "hybrid",
    "LinearAttentionAndSlidingWindowAttentionLayer": "hybrid",
    "LinearAttentionAndStaticFullAttentionLayer": "hybrid_static",
    "LinearAttentionAndStaticSlidingWindowAttentionLayer": "hybrid_static",
    "DummyLayer": "dummy",
    "LinearAttentionLayer": "linear",
    "LinearAttentionCacheLayerMixin": "linear",
    "Fp8QuantizedLayer": "fp8",
    "QuantoQuantizedLayer": "quantized",
    "HQQQuantizedLayer": "quantized",
    "QuantizedLayer": "quantized",
    "BaseQuantizedLayer": "quantized",
    "StaticSlidingWindowLayer": "static_sliding",
    "StaticIndexedLayer": "static",
    "StaticLayer": "static",
    "DynamicSlidingWindowLayer": "sliding",
    "DynamicIndexedLayer": "dynamic",
    "DynamicLayer": "dynamic",
}

SKIP_REASONS = {
    "linear": "linear-attention layer: a fixed-size conv/recurrent state, not a per-token KV cache",
    "dummy": "dummy layer: stores no cache (an MLP/MoE-only layer, or one that reads another layer's KV)",
}

NOTES = {
    "hybrid": "hybrid layer: attention KV observed; its conv/recurrent state is not per-token KV",
    "hybrid_static": "hybrid layer: attention KV observed; its conv/recurrent state is not per-token KV",
}


@dataclass(frozen=True)
class LayerPlan:
    """How to observe one layer class."""

    kind: str  # see the module docstring
    cls_name: str
    known: bool  # False: an unknown layer class, audited through the generic path
    skip_reason: str | None = None  # set for layers that hold no per-token KV
    note: str | None = None
    cls: type | None = None  # the layer class itself (the tracker's per-update check is `type(layer) is cls`)

    @property
    def static(self) -> bool:
        return self.kind in ("static", "static_sliding", "hybrid_static")


_PLANS: dict[type, LayerPlan] = {}


def plan_for(layer: Any) -> LayerPlan:
    """The plan of ``layer``'s class (cached per class)."""
    cls = type(layer)
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _classify(cls)
    return plan


def _classify(cls: type) -> LayerPlan:
    for base in cls.__mro__:
        kind = KNOWN_LAYERS.get(base.__name__)
        if kind is not None and base.__module__.startswith("transformers."):
            return LayerPlan(kind=kind, cls_name=cls.__name__, known=True, skip_reason=SKIP_REASONS.get(kind),
                             note=NOTES.get(kind), cls=cls)
    return LayerPlan(kind="generic", cls_name=cls.__name__, known=False,
                     note=f"unknown cache layer class {cls.__module__}.{cls.__qualname__}: every tensor attribute "
                          "is audited", cls=cls)


def static_filled(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Tokens held by a static layer after an update, in O(1) (no scan of the cache).

    5.5+ keeps counters (``cumulative_length_int``, or a 0-d/1-element ``cumulative_length`` tensor); 5.0's
    sliding layer keeps an int ``cumulative_length``; 5.0–5.4's full static layer keeps nothing, so the
    update's ``cache_kwargs["cache_position"]`` tells the last written position.
    """
    cap = layer.max_cache_len
    n = getattr(layer, "cumulative_length_int", None)
    if n is None:
        c = getattr(layer, "cumulative_length", None)
        if c is not None:
            n = int(c)
    if n is None:
        ck = args[0] if args else kwargs.get("cache_kwargs")
        cp = ck.get("cache_position") if isinstance(ck, dict) else None
        if cp is not None and cp.numel():
            n = int(cp[-1]) + 1
    if n is None:
        return None
    return min(int(n), int(cap))


def iter_plain_tensors(obj: Any, depth: int = 0) -> Iterator[Any]:
    """The plain tensors inside a quantized state: a tensor, a tensor subclass that flattens into inner
    tensors (quanto's QTensor), or tuples/lists/dicts of those (hqq's ``(tensor, meta)``). Bounded depth."""
    if obj is None or depth > 4:
        return
    import torch

    if isinstance(obj, torch.Tensor):
        flatten = getattr(obj, "__tensor_flatten__", None)
        if type(obj) is not torch.Tensor and flatten is not None and type(obj) is not torch.nn.Parameter:
            try:
                names, _ = flatten()
            except Exception:
                names = []
            if names:
                for name in names:
                    yield from iter_plain_tensors(getattr(obj, name, None), depth + 1)
                return
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from iter_plain_tensors(item, depth + 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_plain_tensors(item, depth + 1)


def generic_tensors(layer: Any) -> list[tuple[str, Any]]:
    """(attribute name, tensor) for every tensor attribute of an unknown layer, KV-looking ones first."""
    import torch

    out = []
    for name, value in vars(layer).items():
        if isinstance(value, torch.Tensor) and value.numel() > 1:
            out.append((name, value))
        elif isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
            out.extend((f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor))
    return out

