"""The `Ledger` names of 0.x that its cut surface dropped, each mapped to its replacement for one release: reading
one warns (`DeprecationWarning`, naming the replacement) and then does what the old name did."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from kvguardian.core.ledger.fields import site_of
from kvguardian.core.ledger.notes import Notes
from kvguardian.core.ledger.records import EntrySite, Record, RequestInfo, Update
from kvguardian.core.ledger.slots import Slots
from kvguardian.core.ledger.snapshot import LedgerSnapshot
from kvguardian.core.ledger.totals import LedgerTotals

if TYPE_CHECKING:
    import torch

__all__ = ["RENAMED", "renamed"]


class LedgerSurface(Protocol):
    """What the old names are rebuilt from: `Ledger`'s new surface (this module is below it)."""

    slots: Slots
    notes: Notes

    def observe(self, tensor: torch.Tensor, site: EntrySite, request: RequestInfo | None,
                update: Update = ...) -> Record | None: ...
    def begin_batch(self) -> None: ...
    def end_batch(self) -> None: ...
    def records(self) -> list[Record]: ...
    def snapshot(self) -> LedgerSnapshot: ...
    def totals(self) -> LedgerTotals: ...


def _observe_tensor(ledger: LedgerSurface) -> Callable[..., Any]:
    def observe_tensor(tensor: Any, *, request: Any, **fields: Any) -> Any:
        site, update = site_of(fields)  # type: ignore[arg-type]
        return ledger.observe(tensor, site, request, update)
    return observe_tensor


def _observe_batch(ledger: LedgerSurface) -> Callable[[], contextlib.AbstractContextManager[None]]:
    @contextlib.contextmanager
    def observe_batch() -> Iterator[None]:
        ledger.begin_batch()
        try:
            yield
        finally:
            ledger.end_batch()
    return observe_batch


#: old name -> (facet, its name there): the methods that moved to `Ledger.slots` and `Ledger.notes`
_MOVED = {
    "touch_kv": ("slots", "touch"), "follow": ("slots", "follow"), "add_appends": ("slots", "skipped"),
    "set_filled": ("slots", "fill"), "slot_key": ("slots", "key"), "slot_bytes": ("slots", "nbytes"),
    "note_grad": ("notes", "grad"), "note_error": ("notes", "error"), "note_unknown": ("notes", "unknown"),
    "emit_cache_event": ("notes", "cache_event"), "set_release_error_handler": ("notes", "release_errors_to"),
    "unknown_classes": ("notes", "unknown_classes"),
}
#: old counters, now read from `Ledger.totals()`
_TOTALS = ("instrumentation_errors", "events_dropped", "released_entries", "released_bytes")


def _keys(records: list[Record]) -> set[Hashable]:
    return {r.key for r in records}


def _moved(facet: str, name: str) -> Callable[[LedgerSurface], Any]:
    return lambda led: getattr(getattr(led, facet), name)


def _total(name: str) -> Callable[[LedgerSurface], Any]:
    return lambda led: getattr(led.totals(), name)


#: old name -> (its replacement, as the warning says it; what reading the old name gives)
RENAMED: dict[str, tuple[str, Callable[[LedgerSurface], Any]]] = {
    "observe_tensor": ("observe(tensor, EntrySite(...), request, Update(...))", _observe_tensor),
    "observe_batch": ("begin_batch() ... end_batch()", _observe_batch),
    "unknown_sites": ("snapshot().unknown_sites", lambda led: lambda: led.snapshot().unknown_sites),
    "live_keys": ("{r.key for r in records()}", lambda led: lambda: _keys(led.records())),
    **{old: (f"{facet}.{name}", _moved(facet, name)) for old, (facet, name) in _MOVED.items()},
    **{old: (f"totals().{old}", _total(old)) for old in _TOTALS},
}


def renamed(ledger: LedgerSurface, name: str) -> Any:
    """What ``ledger.<name>`` gave before, with a warning; `AttributeError` for a name the ledger never had."""
    entry = RENAMED.get(name)
    if entry is None:
        raise AttributeError(f"'Ledger' object has no attribute {name!r}")
    replacement, get = entry
    warnings.warn(f"Ledger.{name} is deprecated; use Ledger.{replacement}", DeprecationWarning, stacklevel=3)
    return get(ledger)
