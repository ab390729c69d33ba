"""The narrow interface between the sources and the rest of kv-guardian.

A *source* observes KV memory and reports it into the ledger: the transformers instrumentation
(`kvguardian.runtime.hf`), custom torch models (`kvguardian.runtime.sources.custom`), the retention sampler. A source
is handed a `SourceHost` - the ledger, the current request, fail-open, grad evidence, implicit request begin/end -
and never imports the guard.
The host in turn asks each registered `Source` the few things only it knows (`Source`). `Auditable` is what the
cross-rank check needs of a guard.

Everything here is a Protocol: `kvguardian.runtime.sources.scope.RequestScope` is the host a `Guard` builds, and tests
may hand a source any object that fits.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch

    from kvguardian.core.ledger import Ledger, LedgerSnapshot, Record, RequestInfo

__all__ = ["Auditable", "ImplicitRequest", "Source", "SourceHost", "chain_hints"]


class ImplicitRequest(NamedTuple):
    """An implicit request a source opened around a call (a bare ``generate()``), to be ended with
    `SourceHost.end_implicit`."""

    info: RequestInfo
    token: contextvars.Token[RequestInfo | None]  # restores the current request of the caller's context


class Source(Protocol):
    """What a host asks of a source it knows."""

    def end_manual(self) -> None:
        """End the open requests of manually driven caches (a new request starts, or the program is done)."""

    def request_ending(self, info: RequestInfo) -> None:
        """Before the ledger ends ``info``: bring what the ledger knows of its KV up to date."""

    def request_ended(self, info: RequestInfo) -> None:
        """After the ledger ended ``info``: flush what the source kept about it."""

    def sync(self) -> None:
        """Bring what the ledger knows up to date before it is read (counters too costly to read per step)."""

    def cache_ref(self, rec: Record) -> weakref.ref[Any] | None:
        """A weak reference to the live cache object that holds ``rec``, when this source knows it."""

    def chain_seeds(self, records: Sequence[Record]) -> tuple[dict[Any, Any], dict[Any, list[str]]]:
        """For entries held by a live object this source knows: storage key -> that object (where a holder-chain
        search can start), and the rendered steps from the object down to the storage."""

    def chain_hints(self, records: Sequence[Record]) -> list[Any]:
        """Live objects likely to hold the entries' caches (what their requests returned to the program): the
        holder search expands them with its first level (a heap scan saved when right, nothing lost when
        wrong). A source without such knowledge returns []."""


class SourceHost(Protocol):
    """What a source may use: the ledger, the current request, fail-open, grad evidence, request boundaries."""

    @property
    def ledger(self) -> Ledger:
        """The ledger the source reports into."""

    #: The request of the calling context, or None (a bound ``ContextVar.get``: cheap on the per-layer path).
    current_request: Callable[[], RequestInfo | None]

    def fail(self, site: str, exc: BaseException) -> None:
        """An error inside instrumentation at hook ``site``: counted and logged, never raised into the model (unless
        the guard is strict)."""

    def note_grad(self, tensor: torch.Tensor, layer: int | None) -> None:
        """A KV tensor that requires grad was stored at ``layer`` (evidence for KVG101)."""

    def kv_growing(self) -> None:
        """A request's KV starts to grow in a cache (its first update of it): where memory is worth sampling."""

    def begin_implicit(self, prefix: str) -> ImplicitRequest:
        """Open an implicit request ``<prefix>-<n>`` as the current request of this context."""

    def end_implicit(self, opened: ImplicitRequest) -> None:
        """End a request opened by `begin_implicit` and restore the context's previous current request."""

    def request_starting(self) -> None:
        """A request begins: the open requests of manually driven caches (every source's) end first."""

    def end_manual(self, info: RequestInfo) -> None:
        """End a request a source opened itself for a manually driven cache, and tell every source and listener."""

    def retain(self, obj: object, *, reason: str) -> int:
        """Declare the KV reachable from ``obj`` retained on purpose (`kvguardian.runtime.sources.retained`)."""

    def add_source(self, source: Source) -> None:
        """Register a source: it hears of request boundaries and is asked before reads."""

    def remove_source(self, source: Source) -> None:
        """Unregister a source (its hooks were removed)."""

    def sources(self) -> tuple[Source, ...]:
        """The registered sources."""

    def auditor_objects(self) -> tuple[Any, ...]:
        """kv-guardian's own objects, which a holder-chain search must not walk through."""


class Auditable(Protocol):
    """What the cross-rank check (`kvguardian.runtime.ranks`) needs of a guard."""

    def settle(self) -> None:
        """Let freed memory be freed (a full GC pass, a CUDA sync)."""

    def snapshot(self) -> LedgerSnapshot:
        """The ledger now, sources synced first."""


def chain_hints(sources: Iterable[Source], records: Sequence[Record]) -> list[Any]:
    """Every source's holder-search hints for ``records`` (a source written before hints existed has none)."""
    out: list[Any] = []
    for source in sources:
        fn = getattr(source, "chain_hints", None)
        if fn is not None:
            out += fn(records)
    return out
