"""Cache-level lifecycle of the transformers source: a request's first update of a cache is a cold start
(init) or a reuse (hit); its first-token latency is the time to that layer's second update; at its end, one
sample of the cross-request reuse window (`kvguardian.core.reuse`). Events are buffered until the first token is
out, so they carry its latency.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

from kvguardian.core.ledger import Ledger, RequestInfo
from kvguardian.core.reuse import ReuseWindow
from kvguardian.runtime.hf.observers import CacheUpdate
from kvguardian.runtime.hf.states import CacheState, RequestState

__all__ = ["Lifecycle"]


class Lifecycle:
    """Per active request, what it started cold and what it reused; emits the cache-scope events."""

    def __init__(self, ledger: Ledger, reuse: ReuseWindow, caches: dict[int, CacheState],
                 now: Callable[[], float]) -> None:
        self.ledger = ledger
        self.reuse = reuse
        self._caches = caches  # the tracker's live caches
        self._now = now  # the time of the update being observed
        self._reqs: dict[str, RequestState] = {}
        self.cold_ttft: deque[float] = deque(maxlen=32)  # first-token latencies of requests that reused nothing

    def enter(self, st: CacheState, req: RequestInfo, u: CacheUpdate) -> None:
        """The first update of ``st`` by request ``req``: a cold start (init) or a hit (reuse)."""
        previous = st.owner
        st.owner = req.request_id
        st.owner_req = req
        rs = self._reqs.get(req.request_id)
        if rs is None:
            rs = self._reqs[req.request_id] = RequestState(req, self._now())
        st.rs = rs
        rs.caches += 1
        key_states = u.key_states
        new = int(key_states.shape[-2]) if hasattr(key_states, "shape") and key_states.dim() >= 2 else 0
        before = _tokens_before(st, u, new)
        if st.role == "cross":  # cross-attention KV is the encoder's output, not a prefix of this request
            before = 0
        rs.prefill += new
        if before > 0:
            rs.reused += before
            rs.hits.append((st, previous, before / (before + new) if before + new else 0.0))
        elif not st.init_done:
            st.fields = {
                "shape": tuple(int(s) for s in key_states.shape) if hasattr(key_states, "shape") else None,
                "dtype": str(key_states.dtype) if hasattr(key_states, "dtype") else None,
                "device": str(key_states.device) if hasattr(key_states, "device") else None,
                "layer": u.layer_idx,
            }
            rs.inits.append(st)
        st.init_done = True

    def first_token(self, rs: RequestState, st: CacheState, idx: int) -> None:
        """An update of ``st``'s layer ``idx`` while ``rs``'s first token is not out yet."""
        if rs.first_st is None:
            rs.first_st, rs.first_layer = st, idx
        elif rs.first_st is st and rs.first_layer == idx:
            rs.ttft = self._now() - rs.start  # this layer's second update: the first token is out
            self._flush(rs)

    def request_ended(self, info: RequestInfo) -> list[CacheState]:
        """After the ledger ended ``info``: flush its pending events and add its reuse sample. Returns the caches
        it owned."""
        rs = self._reqs.pop(info.request_id, None)
        if rs is None:
            return []
        if rs.ttft is None:
            rs.ttft = (info.ended if info.ended is not None else self.ledger.clock()) - rs.start
            self._flush(rs)
        elif rs.inits or rs.hits:
            self._flush(rs)
        if rs.caches:
            self.reuse.add(rs.reused > 0, rs.reused, rs.prefill, ts=info.ended)
        owned = [st for st in self._caches.values() if st.owner_req is info]
        for st in owned:
            st.rs = None
        return owned

    def _flush(self, rs: RequestState) -> None:
        req = rs.req
        ttft = rs.ttft
        ledger = self.ledger
        for st in rs.inits:
            f = st.fields
            ledger.notes.cache_event(
                "init", cache=st.label, request=req, nbytes=ledger.slots.nbytes(st.slots()), layer=f.get("layer"),
                shape=f.get("shape"), dtype=f.get("dtype"), device=f.get("device"), first_token_s=ttft,
                detail=f"{st.layer_count} layers" if st.layer_count else None,
            )
            st.fields = {}
        cold = statistics.median(self.cold_ttft) if self.cold_ttft else None
        for st, previous, ratio in rs.hits:
            ledger.notes.cache_event(
                "hit", cache=st.label, request=req, nbytes=ledger.slots.nbytes(st.slots()), hit_ratio=round(ratio, 6),
                first_token_s=ttft,
                latency_delta=(ttft - cold) if ttft is not None and cold is not None else None,
                detail=f"reused from {previous}" if previous else "prefilled before this request (a copy)",
            )
        if not rs.hits and ttft is not None and rs.caches:
            self.cold_ttft.append(ttft)
        rs.inits = []
        rs.hits = []


def _tokens_before(st: CacheState, u: CacheUpdate, new: int) -> int:
    """Tokens the cache held in this layer before this update (O(1))."""
    try:
        if st.generic:
            t = u.out[0] if isinstance(u.out, (tuple, list)) else None
            return max(0, int(t.shape[-2]) - new) if t is not None else 0
        layer = u.cache.layers[u.layer_idx]
        total: Any = getattr(layer, "cumulative_length_int", None)
        if total is None:
            total = getattr(layer, "cumulative_length", None)
        if total is not None:
            return max(0, int(total) - new)
        if getattr(layer, "max_cache_len", None) is not None:  # 5.0–5.4 static: first written position
            ck = u.args[0] if u.args else u.kwargs.get("cache_kwargs")
            cp = ck.get("cache_position") if isinstance(ck, dict) else None
            return int(cp[0]) if cp is not None and cp.numel() else 0
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.dim() >= 2:
            return max(0, int(keys.shape[-2]) - new)
    except Exception:
        return 0
    return 0
