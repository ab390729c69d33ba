"""Storage release tracking: the weak reference on each tracked storage, and the queue its callback fills.

A weak reference with a callback on ``tensor.untyped_storage()`` fires when the storage dies (tensor weakrefs
would not: views share it); the callback only queues itself with the time, far cheaper than
``weakref.finalize`` on the decode path. Queued releases are applied under the ledger's lock at its next
operation, so a release inside another ledger call cannot corrupt an iteration. Details: docs/design/ledger.md.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable

__all__ = ["ReleaseQueue", "StorageRef"]


class StorageRef(weakref.ref):  # type: ignore[type-arg]
    """The weak reference to one tracked storage (or watched object), tagged with its entry id: the release
    queue holds these, and an entry whose ``wref`` is no longer this one has moved on (continued with another
    storage), so its queued release is skipped."""

    __slots__ = ("eid",)
    eid: int


class ReleaseQueue:
    """The weak references whose referent died, oldest first, each with its time of death."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.freed: deque[tuple[StorageRef, float]] = deque()  # read and popped by the ledger (lock held)
        append = self.freed.append

        def on_freed(wref: StorageRef) -> None:
            # Runs inside a storage's deallocation, possibly in another thread or inside a ledger call: it only
            # appends (atomic under the GIL; nothing here can raise but MemoryError); the ledger applies it.
            append((wref, clock()))

        #: the callback of every weak reference the ledger makes (`watch`; the tensor path makes its own
        #: ``StorageRef(storage, on_freed)`` inline, once per tensor per decode step)
        self.on_freed = on_freed

    def watch(self, obj: object, entry_id: int) -> StorageRef:
        """A weak reference to ``obj`` (a storage, or any weak-referenceable object) that queues ``entry_id``'s
        release when ``obj`` dies."""
        wref = StorageRef(obj, self.on_freed)
        wref.eid = entry_id
        return wref
