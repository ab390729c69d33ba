"""Request scopes: which request the KV of the calling context belongs to, and the host the sources talk to.

`RequestScope` is the `SourceHost` of one guard: it owns the context's current request (``guard.request()`` and
the implicit requests of bare ``generate()`` calls and manually driven caches), fail-open, grad evidence and
declared retention, and it tells the registered sources and listeners of every request boundary. It imports
nothing heavy; torch is touched only through what sources hand it.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from kvguardian.core import faults as _faults
from kvguardian.core.errors import UsageError
from kvguardian.core.ledger import Event, Ledger, LedgerSnapshot, RequestInfo
from kvguardian.runtime.sources.grad import GradEvidence
from kvguardian.runtime.sources.host import ImplicitRequest, Source
from kvguardian.runtime.sources.retained import DeclaredRetention

if TYPE_CHECKING:
    import torch

__all__ = ["RequestScope"]

_scope_ids = itertools.count(1)


class RequestScope:
    """The current request of each context, request boundaries, and what sources may use (a `SourceHost`).

    Args:
        ledger: the ledger sources report into.
        strict: raise `InstrumentationError` when a hook fails, instead of failing open (for tests).
    """

    def __init__(self, ledger: Ledger, *, strict: bool = False) -> None:
        self._ledger = ledger
        self.strict = strict
        self._failopen = _faults.FailOpen(ledger.notes.error, strict=strict)
        ledger.notes.release_errors_to(self.fail)  # the weakref callback fails open too
        self._current: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
            f"kvguardian_request_{next(_scope_ids)}", default=None
        )
        self.current_request: Callable[[], RequestInfo | None] = self._current.get
        self._implicit = itertools.count(1)
        self._grad = GradEvidence(ledger)
        self.declared = DeclaredRetention(ledger)
        self._sources: list[Source] = []
        self._listeners: list[Callable[[RequestInfo], None]] = []  # told after every request end
        self._internal: list[Any] = [self, ledger]  # kv-guardian's own objects (see auditor_objects)
        #: called (no arguments) at each cache's first update by a request (`kv_growing`): the pre-OOM guard
        #: (`kvguardian.ops.oom`) samples memory there
        self.on_kv_growth: Callable[[], None] | None = None

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    # ------------------------------------------------------------------ user requests
    @contextlib.contextmanager
    def request(self, request_id: str, tenant: str | None = None) -> Iterator[RequestInfo]:
        """Everything KV-related inside the block belongs to request ``request_id`` (and ``tenant``).

        Raises:
            UsageError: when already inside a request of this scope, or the id is active elsewhere.
        """
        if not isinstance(request_id, str) or not request_id:
            raise UsageError(f"request id must be a non-empty string, got {request_id!r}")
        outer = self._current.get()
        if outer is not None:
            raise UsageError(
                f"guard.request({request_id!r}) inside request {outer.request_id!r}; fix: end the outer "
                "request first (requests do not nest)"
            )
        self.request_starting()
        info = self._ledger.begin_request(request_id, tenant)
        token = self._current.set(info)
        try:
            self._safe_site("request.enter")
            yield info
        finally:
            self._current.reset(token)
            try:
                _faults.maybe_fail("request.exit")
                self._before_request_end(info)
                self._ledger.end_request(request_id)
            except UsageError:
                raise
            except Exception as exc:
                self.fail("request.exit", exc)
            else:
                self._after_request_end(info)

    # ------------------------------------------------------------------ what sources use (SourceHost)
    def begin_implicit(self, prefix: str) -> ImplicitRequest:
        self.request_starting()
        info = self._ledger.begin_request(f"{prefix}-{next(self._implicit)}", None, implicit=True)
        return ImplicitRequest(info, self._current.set(info))

    def end_implicit(self, opened: ImplicitRequest) -> None:
        self._current.reset(opened.token)
        self._before_request_end(opened.info)
        self._ledger.end_request(opened.info.request_id)
        self._after_request_end(opened.info)

    def request_starting(self) -> None:
        try:
            for source in self._sources:
                source.end_manual()
        except Exception as exc:
            self.fail("request.enter", exc)

    def end_manual(self, info: RequestInfo) -> None:
        self._before_request_end(info)
        self._ledger.end_request(info.request_id)
        self._after_request_end(info)

    def fail(self, site: str, exc: BaseException) -> None:
        self._failopen.handle(site, exc)

    def note_grad(self, tensor: torch.Tensor, layer: int | None) -> None:
        req = self._current.get()
        self._grad.note(tensor, layer, req.request_id if req is not None else None)

    def kv_growing(self) -> None:
        hook = self.on_kv_growth
        if hook is not None:
            hook()

    def retain(self, obj: object, *, reason: str) -> int:
        return self.declared.retain(obj, reason=reason)

    def add_source(self, source: Source) -> None:
        self._sources.append(source)
        self._internal.append(source)

    def sources(self) -> tuple[Source, ...]:
        return tuple(self._sources)

    def auditor_objects(self) -> tuple[Any, ...]:
        return tuple(self._internal)

    # ------------------------------------------------------------------ what the guard uses
    def add_listener(self, on_request_end: Callable[[RequestInfo], None], *, owner: object = None) -> None:
        """Call ``on_request_end(info)`` after every request end, after the sources; ``owner`` (the listener's
        object) is kept out of holder-chain searches."""
        self._listeners.append(on_request_end)
        if owner is not None:
            self._internal.append(owner)

    def add_internal(self, obj: object) -> None:
        """Keep ``obj`` (one of kv-guardian's own objects) out of holder-chain searches."""
        self._internal.append(obj)

    def remove_source(self, source: Source) -> None:
        if source in self._sources:
            self._sources.remove(source)
        if source in self._internal:
            self._internal.remove(source)

    def end_implicit_requests(self) -> None:
        """End every open request of a manually driven cache or custom model (the program is done with them)."""
        for source in self._sources:
            source.end_manual()

    def sync_sources(self) -> None:
        """Ask every source to bring the ledger up to date (fail-open)."""
        for source in self._sources:
            try:
                source.sync()
            except Exception as exc:
                self.fail("cache.update", exc)

    def snapshot(self) -> LedgerSnapshot:
        """The ledger now, sources synced first."""
        self.sync_sources()
        return self._ledger.snapshot()

    def events(self) -> list[Event]:
        self.sync_sources()
        return self._ledger.events()

    def take_events(self) -> list[Event]:
        self.sync_sources()
        return self._ledger.take_events()

    @staticmethod
    def settle() -> None:
        """Let freed memory be freed: a full GC pass (and a CUDA sync when CUDA is in use)."""
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    # ------------------------------------------------------------------ internals
    def _before_request_end(self, info: RequestInfo) -> None:
        """Before the ledger ends ``info``: the sources bring its KV up to date (fail-open)."""
        for source in self._sources:
            try:
                source.request_ending(info)
            except Exception as exc:
                self.fail("request.exit", exc)

    def _after_request_end(self, info: RequestInfo) -> None:
        """After the ledger ended ``info``: the sources flush (lifecycle events, reuse), then the listeners."""
        try:
            for source in self._sources:
                source.request_ended(info)
            for listener in self._listeners:
                listener(info)
        except Exception as exc:
            self.fail("request.exit", exc)

    def _safe_site(self, site: str) -> None:
        try:
            _faults.maybe_fail(site)
        except Exception as exc:
            self.fail(site, exc)
