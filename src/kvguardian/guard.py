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
        holder_search_seconds: wall-clock safety net of one holder-chain search in `check` (the search is
            bounded by objects visited; this only stops a search on a machine that is stalled).
        redact: hide dictionary keys in holder chains.
        growth_alpha: significance level of the KVG103 trend test.
        reuse_window: requests in the count-based window of the cross-request reuse rate.
        reuse_seconds: seconds in its time-based window.
        retention_sampling: at request ends, sample (bounded, rate-limited) which containers hold ended
            requests' KV, so that a container seen evicting (an LRU) is judged bounded; ``kv-guardian run``
            and the pytest plugin turn it on.
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        event_capacity: int = 65_536,
        holder_search_seconds: float = 120.0,
        redact: bool = False,
        growth_alpha: float = 1e-5,
        reuse_window: int = 100,
        reuse_seconds: float = 60.0,
        retention_sampling: bool = False,
    ) -> None:
        if reuse_window < 1 or reuse_seconds <= 0:
            raise UsageError(
                f"reuse_window={reuse_window} and reuse_seconds={reuse_seconds} must be positive; "
                "fix: e.g. Guard(reuse_window=100, reuse_seconds=60)"
            )
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
        self.reuse_window = reuse_window
        self.reuse_seconds = reuse_seconds
        self._hf: Any = None  # hf.tracker.HFTracker, created on first use
        self._modules: list[Any] = []  # custom.ModuleTracker objects (guard.track_module)
        self._retained_keys: dict[int, set[Any]] = {}  # id(weakref of a retain() target) -> keys it retained
        self.on_kv_growth: Any = None  # called (no arguments) at each HF cache's first update of a request
        from kvguardian.retention import RetentionMonitor

        self.retention = RetentionMonitor(self, sampling=retention_sampling)

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
        self._request_starting()
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
            else:
                self._after_request_end(info)

    def current_request(self) -> RequestInfo | None:
        return self._current.get()

    def _begin_implicit(self, prefix: str) -> tuple[RequestInfo, contextvars.Token[RequestInfo | None]]:
        self._request_starting()
        info = self.ledger.begin_request(f"{prefix}-{next(self._implicit)}", None, implicit=True)
        return info, self._current.set(info)

    def _end_implicit(self, info: RequestInfo, token: contextvars.Token[RequestInfo | None]) -> None:
        self._current.reset(token)
        self.ledger.end_request(info.request_id)
        self._after_request_end(info)

    def _request_starting(self) -> None:
        """A request begins: requests of manually driven caches (and custom models) still open end here."""
        try:
            if self._hf is not None:
                self._hf.end_manual()
            for mt in self._modules:
                mt.end_manual()
        except Exception as exc:
            self._fail("request.enter", exc)

    def _after_request_end(self, info: RequestInfo) -> None:
        """After the ledger ended ``info``: lifecycle events, the reuse sample, retention sampling."""
        try:
            if self._hf is not None:
                self._hf.request_ended(info)
            self.retention.after_request_end(info)
        except Exception as exc:
            self._fail("request.exit", exc)

    def end_implicit_requests(self) -> None:
        """End every open request of a manually driven cache or custom model (the program is done with them)."""
        if self._hf is not None:
            self._hf.end_manual()
        for mt in self._modules:
            mt.end_manual()

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
        self.hf_tracker()
        return self

    def hf_tracker(self) -> Any:
        """The transformers source of this guard (`hf.tracker.HFTracker`), created on first use."""
        if self._hf is None:
            from kvguardian.hf.tracker import HFTracker

            self._hf = HFTracker(self)
            # the Cache.update wrapper calls the tracker directly: one Python frame less per layer per step
            self._on_cache_update = self._hf.on_update  # type: ignore[method-assign]
        return self._hf

    def audit_process(self, *, generate: bool = True) -> Guard:
        """See every transformers cache of this process, attached model or not (what ``kv-guardian run`` and
        the pytest plugin do): top-level ``generate()`` calls and manually driven caches become implicit
        requests. Undo with `stop_auditing_process`.

        Raises:
            UsageError: transformers is missing or older than 5.0.
        """
        from kvguardian.hf.instrument import process_guard, set_process_guard

        if process_guard() is self:
            return self
        if process_guard() is not None:
            raise UsageError("another guard already audits this process; fix: stop_auditing_process() on it first")
        self.hf_tracker()
        set_process_guard(self, generate=generate)
        return self

    def stop_auditing_process(self) -> None:
        from kvguardian.hf.instrument import process_guard, set_process_guard

        if process_guard() is self:
            set_process_guard(None)

    def track_module(self, model: Any, **kwargs: Any) -> Any:
        """Audit a custom torch model that keeps preallocated KV buffers on its modules (gpt-fast style): the
        buffers are found once through ``model.modules()`` and observed after every forward (O(layers)).
        Keyword arguments go to `kvguardian.custom.ModuleTracker`. Returns the tracker (``.remove()``)."""
        from kvguardian.custom import ModuleTracker

        mt = ModuleTracker(self, model, **kwargs)
        self._modules.append(mt)
        return mt

    def detach(self) -> None:
        """Remove every hook this guard installed. The ledger and its findings stay readable."""
        while self._attached:
            self._attached.pop().remove()
        while self._modules:
            self._modules.pop().remove()
        self.stop_auditing_process()

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

    def retain(self, obj: Any, *, reason: str, evict: Any = None) -> int:
        """Declare that the KV reachable from ``obj`` is kept on purpose (a prefix cache, a session store).

        Objects that support weak references (caches, tensors, most classes) are re-examined at every
        `check`, so KV added to them later is covered too; plain dicts and lists are examined now.
        ``evict(nbytes) -> bytes freed`` makes the retention evictable by the pre-OOM guard
        (`kvguardian.oom`). Returns the number of KV entries marked retained now.
        """
        if not reason:
            raise UsageError("guard.retain(obj, reason=...) needs a reason, e.g. reason='system prompt cache'")
        if evict is not None:
            from kvguardian.oom.evictors import registry_of

            registry_of(self).add(obj, reason, evict)
        try:
            ref: Any = weakref.ref(obj)
        except TypeError:
            ref = None
        if ref is not None:
            with self._lock:
                self._retained.append((ref, reason))
        return self._apply_retention(obj, reason, ref)

    def _apply_retention(self, obj: Any, reason: str, ref: Any = None) -> int:
        """Mark what ``obj`` holds now; what it held before and no longer holds is not retained any more."""
        from kvguardian.tensors.storage import reachable_tensors

        keys = {t.untyped_storage().data_ptr() for t in reachable_tensors(obj)}
        if ref is not None:
            before = self._retained_keys.get(id(ref), set())
            stale = before - keys
            if stale:
                self.ledger.clear_retention(stale)
            self._retained_keys[id(ref)] = keys
        return self.ledger.retain_keys(keys, reason)

    # ------------------------------------------------------------------ hooks (called by sources)
    def _on_cache_update(self, cache: Any, layer_idx: int, key_states: Any = None, args: tuple[Any, ...] = (),
                         kwargs: dict[str, Any] | None = None, out: Any = None) -> None:
        """After `Cache.update(k, v, layer_idx, ...)`: observe the layer's stored K/V storages (O(1) per layer)."""
        if _faults.FAULTS:
            _faults.maybe_fail("cache.update")
        self.hf_tracker().on_update(cache, layer_idx, key_states, args, kwargs or {}, out)

    def _on_cache_updates(self, updates: list[tuple[Any, ...]], started: float | None) -> None:
        """The cache updates of one forward of an attached model, observed when it returned, in order.
        ``started`` (the forward's start) stands for the time of each update when a request's first-token
        latency is measured."""
        tracker = self.hf_tracker()
        tracker._event_time = started
        try:
            with self.ledger.observe_batch():
                for update in updates:
                    try:
                        self._on_cache_update(*update)
                    except Exception as exc:
                        self._fail("cache.update", exc)
        finally:
            tracker._event_time = None

    def _on_cache_evict(self, cache: Any, detail: str) -> None:
        if self._hf is not None:
            self._hf.on_evict(cache, detail)

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
        self._refresh_sources()
        return self.ledger.snapshot()

    def _refresh_sources(self) -> None:
        if self._hf is not None:
            try:
                self._hf.refresh()
            except Exception as exc:
                self._fail("cache.update", exc)

    def events(self) -> list[Event]:
        self._refresh_sources()
        return self.ledger.events()

    def take_events(self) -> list[Event]:
        self._refresh_sources()
        return self.ledger.take_events()

    def settle(self) -> None:
        """Let freed memory be freed: a full GC pass (and a CUDA sync when CUDA is in use)."""
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def check(self, *, holder_chains: bool = True, end_implicit: bool = False) -> Report:
        """Settle, then run every detector over the ledger and return a `Report`.

        Holder chains are searched for orphaned entries and for KV of retired model generations (bounded by
        ``holder_search_seconds``); they also decide whether retained KV is bounded (`kvguardian.retention`).
        ``end_implicit`` first ends the open requests of manually driven caches (what ``kv-guardian run`` does
        when the program is done).
        """
        if end_implicit:
            self.end_implicit_requests()
        self.settle()
        with self._lock:
            live = []
            obj = None
            for ref, reason in self._retained:
                obj = ref()
                if obj is not None:
                    self._apply_retention(obj, reason, ref)
                    live.append((ref, reason))
                else:
                    self._retained_keys.pop(id(ref), None)
            self._retained = live
            del obj
        self._refresh_sources()
        snap = self.ledger.snapshot()
        chains = {}
        orphan_keys = [r.key for r in snap.records if r.state is EntryState.ORPHANED]
        orphan_keys += [r.key for r in stale_records(snap) if r.state is not EntryState.ORPHANED]
        if holder_chains and orphan_keys and "torch" in sys.modules:
            from kvguardian.tensors.holders import find_holder_chains

            seeds, suffixes = self._hf.chain_seeds(snap.records) if self._hf is not None else ({}, {})
            chains = find_holder_chains(
                [k for k in orphan_keys if isinstance(k, int) and k not in seeds],
                seeds=seeds,
                exclude=(self, self.ledger, self.retention, self._hf),
                max_seconds=self.holder_search_seconds,
                redact=self.redact,
                collect=False,
            )
            seeds.clear()
            for key, suffix in suffixes.items():
                ch = chains.get(key)
                if ch is not None and ch.steps:
                    ch.steps[-1:] = suffix
        verdicts = self.retention.classify(snap, chains) if chains else {}
        ctx = DetectContext(holder_chains=chains, growth_alpha=self.growth_alpha,
                            options={"retention": verdicts})
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
        if self._hf is not None:
            for cls, why in sorted(self._hf.unknown.items()):
                findings.append(Finding(
                    id="KVG107", severity=Severity.WARNING,
                    message=f"cache class {cls} is not one kv-guardian knows; audited through the generic path "
                            f"({why})",
                    evidence={"class": cls, "reason": why},
                ))
        return Report(findings=findings, summary=self.summary(snap))

    def summary(self, snap: LedgerSnapshot | None = None) -> dict[str, Any]:
        """The ledger summary plus accounting, lifecycle, reuse rates and the sources' notes (JSON-ready)."""
        from kvguardian.accounting import kv_accounting

        snap = snap if snap is not None else self.snapshot()
        out = snap.summary()
        out["kv"] = kv_accounting(snap)
        out["reuse"] = self.reuse_rates()
        if self._hf is not None:
            out["hf"] = self._hf.summary()
        if self._modules:
            out["custom_models"] = [mt.describe() for mt in self._modules]
        out["retention"] = self.retention.summary()
        return out

    def reuse_rate(self, *, last: int | None = None, seconds: float | None = None) -> dict[str, Any]:
        """Cross-request KV reuse over the last ``last`` requests or ``seconds`` (exactly one of them):
        requests, hits, hit_rate, reused_tokens, token_reuse_rate."""
        from kvguardian.reuse import ReuseWindow

        window: ReuseWindow = self.hf_tracker().reuse
        return window.rate(last=last, seconds=seconds)

    def reuse_rates(self) -> dict[str, Any]:
        """Both windows (count- and time-based) as configured on the guard."""
        return {"by_count": self.reuse_rate(last=self.reuse_window),
                "by_time": self.reuse_rate(seconds=self.reuse_seconds)}
