"""The Guard: the public entry point that ties sources, the ledger and the detectors together.

    guard = Guard()
    guard.attach(model)                        # Hugging Face: instruments its caches
    with guard.request("r-17", tenant="acme"):
        model.generate(ids, max_new_tokens=64)
    guard.retain(prefix_cache, reason="system prompt")
    report = guard.check()

Importing this module imports neither torch nor transformers; `attach` and `track` import them when called.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import itertools
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from kvguardian import _faults
from kvguardian._errors import UsageError
from kvguardian.detectors import DetectContext, run_all
from kvguardian.detectors.stale_generation import stale_records
from kvguardian.findings import Finding, Report, Severity
from kvguardian.ledger import EntryState, Event, Ledger, LedgerSnapshot, RequestInfo

__all__ = ["Guard"]

_guard_ids = itertools.count(1)


class Guard:
    """Records every KV entry's lifecycle per request and proves leaks.

    Args:
        strict: raise `InstrumentationError` when a hook fails, instead of failing open (for tests).
        event_capacity: lifecycle events kept in the bounded buffer.
        holder_search_seconds: time bound of one holder-chain search in `check`.
        redact: hide dictionary keys in holder chains.
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        event_capacity: int = 65_536,
        holder_search_seconds: float = 3.0,
        redact: bool = False,
        growth_alpha: float = 1e-5,
    ) -> None:
        self.ledger = Ledger(event_capacity=event_capacity)
        self.strict = strict
        self.redact = redact
        self.holder_search_seconds = holder_search_seconds
        self.growth_alpha = growth_alpha
        self._failopen = _faults.FailOpen(self.ledger.note_error, strict=strict)
        self._id = next(_guard_ids)
        self._current: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
            f"kvguardian_request_{self._id}", default=None
        )
        self._implicit = itertools.count(1)
        self._attached: list[Any] = []  # hf.Attachment objects (hold weak refs to models)
        self._retained: list[tuple[Any, str]] = []  # (weakref to holder object, reason)
        self._grad_obs: dict[str | None, dict[str, Any]] = {}  # request -> live evidence (bounded)
        self._lock = threading.RLock()
        self.ledger._on_release_error = self._fail  # the weakref callback fails open too

    def __repr__(self) -> str:
        return f"<Guard #{self._id} entries={len(self.ledger)} strict={self.strict}>"

    # ------------------------------------------------------------------ requests
    @contextlib.contextmanager
    def request(self, request_id: str, tenant: str | None = None) -> Iterator[RequestInfo]:
        """Everything KV-related inside the block belongs to request ``request_id`` (and ``tenant``).

        Raises:
            UsageError: when already inside a request of this guard, or the id is active elsewhere.
        """
        if not isinstance(request_id, str) or not request_id:
            raise UsageError(f"request id must be a non-empty string, got {request_id!r}")
        outer = self._current.get()
        if outer is not None:
            raise UsageError(
                f"guard.request({request_id!r}) inside request {outer.request_id!r}; fix: end the outer "
                "request first (requests do not nest)"
            )
        info = self.ledger.begin_request(request_id, tenant)
        token = self._current.set(info)
        try:
            self._safe_site("request.enter")
            yield info
        finally:
            self._current.reset(token)
            try:
                _faults.maybe_fail("request.exit")
                self.ledger.end_request(request_id)
            except UsageError:
                raise
            except Exception as exc:
                self._fail("request.exit", exc)

    def current_request(self) -> RequestInfo | None:
        return self._current.get()

    def _begin_implicit(self, prefix: str) -> tuple[RequestInfo, contextvars.Token[RequestInfo | None]]:
        info = self.ledger.begin_request(f"{prefix}-{next(self._implicit)}", None, implicit=True)
        return info, self._current.set(info)

    def _end_implicit(self, info: RequestInfo, token: contextvars.Token[RequestInfo | None]) -> None:
        self._current.reset(token)
        self.ledger.end_request(info.request_id)

    def new_generation(self) -> int:
        """Declare a model reload: KV created from now on belongs to the next generation."""
        return self.ledger.bump_generation()

    # ------------------------------------------------------------------ sources
    def attach(self, model: Any) -> Guard:
        """Instrument a Hugging Face transformers model's caches (every `Cache.update` it makes).

        Raises:
            UsageError: not a transformers model (use `track` for custom models), or already attached.
        """
        from kvguardian.hf.instrument import attach_model

        self._attached.append(attach_model(self, model))
        return self

    def detach(self) -> None:
        """Remove every hook this guard installed. The ledger and its findings stay readable."""
        while self._attached:
            self._attached.pop().remove()

    def track(self, keys: Any, values: Any = None, *, layer: int | None = None, source: str = "track") -> None:
        """Record K (and V) tensors of a custom model's cache for the current request.

        Call it after each cache write (a new tensor per step, or the same preallocated buffer): views of
        one storage are one entry. Never raises into the model (fails open) unless ``strict``.
        """
        try:
            _faults.maybe_fail("track")
            req = self._current.get()
            owner = req.request_id if req is not None else None
            for kind, t in (("k", keys), ("v", values)):
                if t is None:
                    continue
                self.ledger.observe_tensor(
                    t, kind=kind, layer=layer, request=req, source=source, slot=(owner, layer, kind)
                )
                if t.requires_grad:
                    self._note_grad(t, layer)
        except Exception as exc:
            self._fail("track", exc)

    def retain(self, obj: Any, *, reason: str) -> int:
        """Declare that the KV reachable from ``obj`` is kept on purpose (a prefix cache, a session store).

        Objects that support weak references (caches, tensors, most classes) are re-examined at every
        `check`, so KV added to them later is covered too; plain dicts and lists are examined now.
        Returns the number of KV entries marked retained now.
        """
        if not reason:
            raise UsageError("guard.retain(obj, reason=...) needs a reason, e.g. reason='system prompt cache'")
        try:
            ref: Any = weakref.ref(obj)
        except TypeError:
            ref = None
        if ref is not None:
            with self._lock:
                self._retained.append((ref, reason))
        return self._apply_retention(obj, reason)

    def _apply_retention(self, obj: Any, reason: str) -> int:
        from kvguardian.tensors.storage import reachable_tensors

        keys = [t.untyped_storage().data_ptr() for t in reachable_tensors(obj)]
        return self.ledger.retain_keys(keys, reason)

    # ------------------------------------------------------------------ hooks (called by sources)
    def _on_cache_update(self, cache: Any, layer_idx: int) -> None:
        """After `Cache.update(k, v, layer_idx, ...)`: observe the layer's stored K/V storages."""
        _faults.maybe_fail("cache.update")
        layer = cache.layers[layer_idx]
        keys = getattr(layer, "keys", None)
        if keys is None:
            return
        values = getattr(layer, "values", None)
        req = self._current.get()
        source = type(layer).__name__
        capacity = getattr(layer, "max_cache_len", None)
        filled = None
        if capacity is not None:
            seq = layer.get_seq_length()
            filled = int(seq)
        cid = id(cache)
        observe = self.ledger.observe_tensor
        observe(keys, kind="k", layer=layer_idx, request=req, source=source, slot=(cid, layer_idx, "k"),
                filled_tokens=filled, capacity_tokens=capacity)
        if values is not None:
            observe(values, kind="v", layer=layer_idx, request=req, source=source, slot=(cid, layer_idx, "v"),
                    filled_tokens=filled, capacity_tokens=capacity)
        if keys.requires_grad or (values is not None and values.requires_grad):
            self._note_grad(keys if keys.requires_grad else values, layer_idx)  # off the no-grad hot path

    def _note_grad(self, tensor: Any, layer: int | None) -> None:
        """A grad-tracked KV tensor was stored. The first one of a request is walked (bounded) for evidence;
        every later one only checks, in O(1), whether the stored tensor's graph reaches the previous step's
        stored KV (``grad_fn.next_functions[0]``: the cat/index_copy input that was already cached). That is
        the leak: each step's graph chained to the last. A cache detached between steps never chains."""
        req = self._current.get()
        rid = req.request_id if req is not None else None
        fn = tensor.grad_fn
        nxt: Any = fn.next_functions if fn is not None else ()
        chained = bool(nxt) and nxt[0][0] is not None
        obs = self._grad_obs.get(rid)
        if obs is None:
            from kvguardian.tensors.autograd import walk_graph

            stats = walk_graph(tensor, max_nodes=5_000, max_seconds=0.2)
            obs = {
                "request_id": rid,
                "layers": [layer],
                "seq_len_at_detection": int(tensor.shape[-2]) if tensor.dim() >= 2 else None,
                "requires_grad": bool(tensor.requires_grad),
                "grad_fn": type(fn).__name__ if fn is not None else None,
                "kv_tensor_bytes": tensor.untyped_storage().nbytes(),
                "layer_updates": {},
                "chained_updates": 0,
                **stats.to_evidence(),
            }
            self._grad_obs[rid] = obs
            if len(self._grad_obs) > 1_024:  # bounded: forget the oldest
                self._grad_obs.pop(next(iter(self._grad_obs)))
            self.ledger.note_grad(obs)
        elif layer not in obs["layers"]:
            obs["layers"].append(layer)
        lu = obs["layer_updates"]
        lu[layer] = lu.get(layer, 0) + 1
        if chained:
            obs["chained_updates"] += 1

    def _fail(self, site: str, exc: BaseException) -> None:
        self._failopen.handle(site, exc)

    def _safe_site(self, site: str) -> None:
        try:
            _faults.maybe_fail(site)
        except Exception as exc:
            self._fail(site, exc)

    # ------------------------------------------------------------------ reading
    def snapshot(self) -> LedgerSnapshot:
        return self.ledger.snapshot()

    def events(self) -> list[Event]:
        return self.ledger.events()

    def take_events(self) -> list[Event]:
        return self.ledger.take_events()

    def settle(self) -> None:
        """Let freed memory be freed: a full GC pass (and a CUDA sync when CUDA is in use)."""
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def check(self, *, holder_chains: bool = True) -> Report:
        """Settle, then run every detector over the ledger and return a `Report`.

        Holder chains are searched for orphaned entries and for KV of retired model generations (bounded by
        ``holder_search_seconds``).
        """
        self.settle()
        with self._lock:
            live = []
            obj = None
            for ref, reason in self._retained:
                obj = ref()
                if obj is not None:
                    self._apply_retention(obj, reason)
                    live.append((ref, reason))
            self._retained = live
            del obj
        snap = self.ledger.snapshot()
        chains = {}
        orphan_keys = [r.key for r in snap.records if r.state is EntryState.ORPHANED]
        orphan_keys += [r.key for r in stale_records(snap) if r.state is not EntryState.ORPHANED]
        if holder_chains and orphan_keys and "torch" in sys.modules:
            from kvguardian.tensors.holders import find_holder_chains

            chains = find_holder_chains(
                [k for k in orphan_keys if isinstance(k, int)],
                exclude=(self, self.ledger),
                max_seconds=self.holder_search_seconds,
                redact=self.redact,
                collect=False,
            )
        ctx = DetectContext(holder_chains=chains, growth_alpha=self.growth_alpha)
        findings: list[Finding] = run_all(snap, ctx)
        errors = sum(snap.instrumentation_errors.values())
        if errors:
            findings.append(
                Finding(
                    id="KVG100",
                    severity=Severity.WARNING,
                    message=(
                        f"{errors} instrumentation error(s) were contained (fail-open) at "
                        f"{sorted(snap.instrumentation_errors)}; the ledger may be incomplete"
                    ),
                    evidence={"errors_by_site": dict(snap.instrumentation_errors)},
                )
            )
        return Report(findings=findings, summary=snap.summary())
