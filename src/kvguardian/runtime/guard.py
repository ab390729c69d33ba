"""The Guard: the public entry point, a facade over the ledger, the sources and the check pipeline.

    guard = Guard()
    guard.attach(model)                        # Hugging Face: instruments its caches
    with guard.request("r-17", tenant="acme"):
        model.generate(ids, max_new_tokens=64)
    report = guard.check()

Importing this module imports neither torch nor transformers. What is where: docs/design/guard.md.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Report
from kvguardian.core.ledger import Event, Ledger, LedgerSnapshot, RequestInfo
from kvguardian.core.options import check_guard
from kvguardian.core.reuse import ReuseWindow
from kvguardian.runtime.check import CheckOptions, run_check
from kvguardian.runtime.retention import RetentionMonitor
from kvguardian.runtime.sources.scope import RequestScope

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from kvguardian.runtime.hf.attach import Attachment
    from kvguardian.runtime.hf.tracker import HFTracker
    from kvguardian.runtime.sources.custom import ModuleTracker
    from kvguardian.runtime.sources.evictable import EvictCallback

__all__ = ["Guard"]

_guard_ids = itertools.count(1)


class Guard:
    """Records every KV entry's lifecycle per request and proves leaks (docs/design/guard.md).

    Args:
        strict: raise `InstrumentationError` when a hook fails, instead of failing open.
        event_capacity: lifecycle events kept in the bounded buffer.
        holder_search_seconds: wall-clock safety net of one holder-chain search.
        redact: hide dictionary keys in holder chains.
        growth_alpha: significance level of the KVG103 trend test.
        reuse_window, reuse_seconds: windows of the cross-request reuse rate.
        retention_sampling: sample which containers hold ended requests' KV.
        decode_stride: observe one decode forward in this many (1: all).

    Raises:
        UsageError: an argument of the wrong type or out of range.
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
        decode_stride: int = 8,
    ) -> None:
        check_guard({"strict": strict, "event_capacity": event_capacity, "redact": redact,
                     "holder_search_seconds": holder_search_seconds, "growth_alpha": growth_alpha,
                     "reuse_window": reuse_window, "reuse_seconds": reuse_seconds,
                     "retention_sampling": retention_sampling, "decode_stride": decode_stride})
        self._id = next(_guard_ids)
        self.ledger = Ledger(event_capacity=event_capacity)
        self.strict = strict
        self.scope = RequestScope(self.ledger, strict=strict)  # what every source talks to
        self.scope.add_internal(self)
        # what check() runs with (`kvguardian.runtime.check.CheckOptions`)
        self.holder_search_seconds = holder_search_seconds
        self.redact = redact
        self.growth_alpha = growth_alpha
        # the cross-request reuse windows, sampled by the transformers source at each request end
        self._reuse = ReuseWindow(clock=self.ledger.clock)
        self.reuse_window = reuse_window
        self.reuse_seconds = reuse_seconds
        self.retention = RetentionMonitor(self.scope, sampling=retention_sampling,
                                          max_seconds=holder_search_seconds)
        self.scope.add_listener(self.retention.after_request_end, owner=self.retention)
        self.decode_stride = decode_stride
        self._hf: HFTracker | None = None  # the transformers source, created on first use
        self._attached: list[Attachment] = []
        self._modules: list[ModuleTracker] = []

    def __repr__(self) -> str:
        return f"<Guard #{self._id} entries={len(self.ledger)} strict={self.strict}>"

    # ------------------------------------------------------------------ requests
    def request(self, request_id: str, tenant: str | None = None) -> AbstractContextManager[RequestInfo]:
        """Everything KV-related inside the block belongs to request ``request_id`` (and ``tenant``).

        Raises:
            UsageError: when already inside a request of this guard, or the id is active elsewhere.
        """
        return self.scope.request(request_id, tenant)

    def current_request(self) -> RequestInfo | None:
        return self.scope.current_request()

    def end_implicit_requests(self) -> None:
        """End every open request of a manually driven cache or custom model (the program is done with them)."""
        self.scope.end_implicit_requests()

    def new_generation(self) -> int:
        """Declare a model reload: KV created from now on belongs to the next generation."""
        return self.ledger.bump_generation()

    # ------------------------------------------------------------------ sources
    def attach(self, model: PreTrainedModel) -> Guard:
        """Instrument a Hugging Face transformers model's caches (every `Cache.update` it makes).

        Nothing is stored on the model (see `hf.attach`): ``copy.deepcopy``, pickle and ``torch.save`` of an
        attached model give an **unattached** copy that runs its own weights (attach it too to audit it); the
        original stays attached, its outputs unchanged; `detach` works before or after copying.

        Raises:
            UsageError: not a transformers model (use `track` for custom models), or already attached.
        """
        from kvguardian.runtime.hf.attach import attach_model, check_attachable

        check_attachable(model)
        self._attached.append(attach_model(self.hf_tracker(), model))
        return self

    def hf_tracker(self) -> HFTracker:
        """The transformers source of this guard (`hf.tracker.HFTracker`), created on first use."""
        if self._hf is None:
            from kvguardian.runtime.hf.tracker import HFTracker

            self._hf = HFTracker(self.scope, reuse=self._reuse, decode_stride=self.decode_stride)
        return self._hf

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        """The hooks `attach` installed, one `hf.attach.Attachment` per model (``.enabled``, ``.remove()``)."""
        return tuple(self._attached)

    def attach_process(self, *, generate: bool = True) -> Guard:
        """Attach to every transformers cache of this process, attached model or not (what ``kv-guardian run``
        and the pytest plugin do): top-level ``generate()`` calls and manually driven caches become implicit
        requests. Undo with `detach_process`.

        Raises:
            UsageError: transformers is missing or older than 5.0.
        """
        from kvguardian.runtime.hf.instrument import process_tracker, set_process_tracker

        current = process_tracker()
        if current is not None and current is self._hf:
            return self
        if current is not None:
            raise UsageError("another guard is already attached to this process; fix: detach_process() on it first")
        set_process_tracker(self.hf_tracker(), generate=generate)
        return self

    def detach_process(self) -> None:
        """Undo `attach_process` (nothing when this guard is not the process's)."""
        from kvguardian.runtime.hf.instrument import process_tracker, set_process_tracker

        if self._hf is not None and process_tracker() is self._hf:
            set_process_tracker(None)

    def audit_process(self, *, generate: bool = True) -> Guard:
        """Deprecated old name of `attach_process` (it attaches; it does not audit): goes after the next release."""
        _renamed("audit_process", "attach_process")
        return self.attach_process(generate=generate)

    def stop_auditing_process(self) -> None:
        """Deprecated old name of `detach_process`: goes after the next release."""
        _renamed("stop_auditing_process", "detach_process")
        self.detach_process()

    def track_module(self, model: torch.nn.Module, **kwargs: Any) -> ModuleTracker:
        """Audit a custom torch model that keeps preallocated KV buffers on its modules (gpt-fast style): the
        buffers are found once through ``model.modules()`` and observed after every forward (O(layers)).
        Keyword arguments go to `kvguardian.runtime.sources.custom.ModuleTracker`. Returns the tracker
        (``.remove()``)."""
        from kvguardian.runtime.sources.custom import ModuleTracker

        mt = ModuleTracker(self.scope, model, **kwargs)
        self._modules.append(mt)
        return mt

    def detach(self) -> None:
        """Remove every hook this guard installed. The ledger and its findings stay readable."""
        while self._attached:
            self._attached.pop().remove()
        while self._modules:
            self._modules.pop().remove()
        self.detach_process()

    def track(self, keys: torch.Tensor, values: torch.Tensor | None = None, *, layer: int | None = None,
              source: str = "track") -> None:
        """Record K (and V) tensors of a custom model's cache for the current request.

        Call it after each cache write (a new tensor per step, or the same preallocated buffer): views of
        one storage are one entry. Never raises into the model (fails open) unless ``strict``.
        """
        from kvguardian.runtime.sources.custom import track_tensors

        track_tensors(self.scope, (keys, values), layer=layer, source=source)

    def retain(self, obj: object, *, reason: str, evict: EvictCallback | None = None) -> int:
        """Declare that the KV reachable from ``obj`` is kept on purpose (a prefix cache, a session store).

        Objects that support weak references (caches, tensors, most classes) are re-examined at every
        `check`, so KV added to them later is covered too; plain dicts and lists are examined now.
        ``evict(nbytes) -> bytes freed`` makes the retention evictable by the pre-OOM guard
        (`kvguardian.ops.oom`). Returns the number of KV entries marked retained now.
        """
        marked = self.scope.retain(obj, reason=reason)  # raises UsageError without a reason
        if evict is not None:
            from kvguardian.runtime.sources.evictable import registry_of

            registry_of(self).add(obj, reason, evict)
        return marked

    @property
    def on_kv_growth(self) -> Callable[[], None] | None:
        """Called (no arguments) at each cache's first update by a request: the pre-OOM guard samples memory there."""
        return self.scope.on_kv_growth

    @on_kv_growth.setter
    def on_kv_growth(self, hook: Callable[[], None] | None) -> None:
        self.scope.on_kv_growth = hook

    # ------------------------------------------------------------------ reading
    def snapshot(self) -> LedgerSnapshot:
        return self.scope.snapshot()

    def events(self) -> list[Event]:
        return self.scope.events()

    def take_events(self) -> list[Event]:
        return self.scope.take_events()

    def settle(self) -> None:
        """Let freed memory be freed: a full GC pass (and a CUDA sync when CUDA is in use)."""
        self.scope.settle()

    def check(self, *, holder_chains: bool = True, end_implicit: bool = False) -> Report:
        """Settle, then run every detector over the ledger and return a `Report` (`kvguardian.runtime.check`).

        Holder chains are searched for orphaned entries and for KV of retired model generations (bounded by
        ``holder_search_seconds``); they also decide whether retained KV is bounded (`kvguardian.runtime.retention`).
        ``end_implicit`` first ends the open requests of manually driven caches (what ``kv-guardian run`` does
        when the program is done).
        """
        options = CheckOptions(holder_chains=holder_chains, holder_search_seconds=self.holder_search_seconds,
                               redact=self.redact, growth_alpha=self.growth_alpha, end_implicit=end_implicit)
        return run_check(self.scope, self.retention, options, self.summary)

    def summary(self, snap: LedgerSnapshot | None = None) -> dict[str, Any]:
        """The ledger summary plus accounting, lifecycle, reuse rates and the sources' notes (JSON-ready)."""
        from kvguardian.core.accounting import kv_accounting

        snap = snap if snap is not None else self.snapshot()
        out = snap.summary()
        out["kv"] = kv_accounting(snap)
        out["reuse"] = self.reuse_rates()
        if self._hf is not None:
            out["hf"] = self._hf.summary()
        if self._modules:
            out["custom_models"] = [mt.describe() for mt in self._modules]
        out["retention"] = self.retention.summary()
        out["versions"] = _versions()
        out["timeline"] = self.ledger.timeline(snap)
        return out

    def reuse_rate(self, *, last: int | None = None, seconds: float | None = None) -> dict[str, Any]:
        """Cross-request KV reuse over the last ``last`` requests or ``seconds`` (exactly one of them):
        requests, hits, hit_rate, reused_tokens, token_reuse_rate."""
        return self._reuse.rate(last=last, seconds=seconds)

    def reuse_rates(self) -> dict[str, Any]:
        """Both windows (count- and time-based) as configured on the guard."""
        return {"by_count": self.reuse_rate(last=self.reuse_window),
                "by_time": self.reuse_rate(seconds=self.reuse_seconds)}


def _versions() -> dict[str, str | None]:
    """What the report was made with: kv-guardian, Python, and torch/transformers when the program uses them."""
    import platform
    import sys

    def of(module: str) -> str | None:  # only modules already imported: nothing is imported to ask
        mod = sys.modules.get(module)
        return None if mod is None else str(getattr(mod, "__version__", None))

    return {"kv-guardian": of("kvguardian"), "python": platform.python_version(), "torch": of("torch"),
            "transformers": of("transformers")}


def _renamed(old: str, new: str) -> None:
    """One `DeprecationWarning` for a renamed `Guard` method, pointing at the caller's line."""
    warnings.warn(f"Guard.{old} is now Guard.{new}; the old name goes after the next release", DeprecationWarning,
                  stacklevel=3)
