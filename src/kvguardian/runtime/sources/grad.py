"""Evidence of grad-tracked KV (KVG101): what a source reports when a stored KV tensor requires grad.

The first grad-tracked tensor of a request is walked (bounded) for evidence; every later one only checks, in
O(1), whether the stored tensor's graph reaches the previous step's stored KV (``grad_fn.next_functions[0]``:
the cat/index_copy input that was already cached). That is the leak: each step's graph chained to the last. A
cache detached between steps never chains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvguardian.core.callsite import user_site, warn_at_user
from kvguardian.core.ledger import Ledger

if TYPE_CHECKING:
    import torch

__all__ = ["GradEvidence"]


class GradEvidence:
    """Per request, the evidence of its grad-tracked KV; bounded, shared with the ledger (`Ledger.notes.grad`)."""

    def __init__(self, ledger: Ledger, *, max_requests: int = 1_024) -> None:
        self._ledger = ledger
        self._max = max_requests
        self._by_request: dict[str | None, dict[str, Any]] = {}  # request id -> its live evidence

    def note(self, tensor: torch.Tensor, layer: int | None, request_id: str | None) -> None:
        """``tensor`` (stored KV of ``layer``) requires grad, in request ``request_id``."""
        fn = tensor.grad_fn
        nxt: Any = fn.next_functions if fn is not None else ()
        chained = bool(nxt) and nxt[0][0] is not None
        obs = self._by_request.get(request_id)
        if obs is None:
            obs = self._first(tensor, layer, request_id)
        elif layer not in obs["layers"]:
            obs["layers"].append(layer)
        lu = obs["layer_updates"]
        lu[layer] = lu.get(layer, 0) + 1
        if chained:
            obs["chained_updates"] += 1

    def _first(self, tensor: torch.Tensor, layer: int | None, request_id: str | None) -> dict[str, Any]:
        """The evidence of a request's first grad-tracked tensor: a bounded walk of its graph."""
        from kvguardian.core.tensors.autograd import walk_graph

        fn = tensor.grad_fn
        stats = walk_graph(tensor, max_nodes=5_000, max_seconds=0.2)
        obs = {
            "request_id": request_id,
            "layers": [layer],
            "seq_len_at_detection": int(tensor.shape[-2]) if tensor.dim() >= 2 else None,
            "requires_grad": bool(tensor.requires_grad),
            "grad_fn": type(fn).__name__ if fn is not None else None,
            "kv_tensor_bytes": tensor.untyped_storage().nbytes(),
            "layer_updates": {},
            "chained_updates": 0,
            "call_site": user_site(),  # the user's line that ran the forward (a generate() call, a model call)
            **stats.to_evidence(),
        }
        self._by_request[request_id] = obs
        if len(self._by_request) > self._max:  # bounded: forget the oldest
            self._by_request.pop(next(iter(self._by_request)))
        self._ledger.notes.grad(obs)
        where = f"request {request_id!r}" if request_id is not None else "an unowned cache"
        warn_at_user(f"kv-guardian KVG101: KV of {where} (layer {layer}) is stored with an autograd graph; "
                     "decode under torch.inference_mode() or torch.no_grad(), or detach the cache")
        return obs
