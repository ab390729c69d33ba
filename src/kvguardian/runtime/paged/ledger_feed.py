"""The adapter from a pool's prefix-cache events to the `Ledger`: each cached block becomes a KV entry.

- ``stored`` → `Ledger.add_entry` (owner: the request that filled the block, if the ledger knows it), declared
  retained: the prefix cache keeps blocks on purpose and the pool bounds it;
- ``hit`` → `Ledger.touch_entry`: the reusing request becomes the owner (a ledger "hit" event);
- ``removed`` → `Ledger.release_entry`; ``cleared`` → every entry this feed added is released.

As with vLLM's KV events, removals of unknown hashes are ignored and repeated announcements deduplicated;
a gap in sequence numbers (events dropped by the pool's bounded buffer) is counted in ``gaps``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ClassVar

from kvguardian.core.ledger import Ledger, RequestInfo
from kvguardian.runtime.paged.prefix import KVEvent

if TYPE_CHECKING:  # pragma: no cover
    from kvguardian.runtime.paged.pool import PagedKVPool

__all__ = ["LedgerFeed"]


class LedgerFeed:
    """Feeds one pool's events into ``ledger``; call `pump` whenever convenient (after each engine step)."""

    def __init__(self, ledger: Ledger, *, name: str = "pool", retain_reason: str = "prefix cache (bounded by the pool)",
                 max_entries: int = 1_000_000) -> None:
        self.ledger = ledger
        self.name = name
        self.retain_reason = retain_reason
        self.max_entries = max_entries  # bound on entries this feed keeps live in the ledger
        self._keys: set[tuple[str, str]] = set()  # entries this feed added and has not released
        self.last_seq = 0
        self.gaps = 0  # events missing from the stream (dropped before they were taken)
        self.applied = 0

    def pump(self, pool: PagedKVPool) -> int:
        """Take the pool's buffered events and apply them; returns how many were applied."""
        return self.apply(pool.take_events())

    def apply(self, events: Iterable[KVEvent]) -> int:
        n = 0
        for ev in events:
            if ev.seq > self.last_seq + 1:  # the stream starts at 1: anything skipped was dropped
                self.gaps += ev.seq - self.last_seq - 1
            self.last_seq = ev.seq
            handler = self._HANDLERS.get(ev.kind)
            if handler is not None:
                handler(self, ev)
            n += 1
        self.applied += n
        return n

    def _stored(self, ev: KVEvent) -> None:
        led, req = self.ledger, self._request(ev.request_id)
        fresh = []
        for h in ev.block_hashes:
            key = (self.name, h)
            if key in self._keys:
                led.touch_entry(key, req)
            elif len(self._keys) < self.max_entries:
                led.add_entry(key, kind="block", nbytes=ev.block_bytes, request=req, source="paged-pool")
                self._keys.add(key)
                fresh.append(key)
        if fresh:
            led.retain_keys(fresh, self.retain_reason)

    def _hit(self, ev: KVEvent) -> None:
        req = self._request(ev.request_id)
        for h in ev.block_hashes:
            key = (self.name, h)
            if key in self._keys:
                self.ledger.touch_entry(key, req)

    def _removed(self, ev: KVEvent) -> None:
        for h in ev.block_hashes:
            key = (self.name, h)
            if key in self._keys:
                self._keys.discard(key)
                self.ledger.release_entry(key, detail="evicted")

    def _cleared(self, ev: KVEvent) -> None:
        for key in list(self._keys):
            self.ledger.release_entry(key, detail="cleared")
        self._keys.clear()

    _HANDLERS: ClassVar[dict[str, Callable[[LedgerFeed, KVEvent], None]]] = {
        "stored": _stored, "hit": _hit, "removed": _removed, "cleared": _cleared,
    }

    def _request(self, request_id: str | None) -> RequestInfo | None:
        if request_id is None:
            return None
        info = self.ledger.request(request_id)
        return info if info is not None and info.active else None
