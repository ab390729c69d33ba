"""The ledger: the one record of KV entries and their lifecycle events.

=============  ==============================================================================================
module         what it owns
=============  ==============================================================================================
`records`      `Record` (one KV entry), `RequestInfo`, `EntryState`, and the small types sources describe an
               observation with (`EntrySite`, `Update`, `EntryView`)
`table`        the index of live entries and every state change (init, append, hit, owner ended, release)
`tensors`      the per-step tensor path: a slot's entry continues with the next storage
`events`       `Event` and the one bounded event buffer
`releases`     the weak reference on each storage and the queue its callback fills
`totals`       totals kept as entries change (`LedgerTotals`, for scrapes)
`snapshot`     `LedgerSnapshot`, the immutable copy detectors and sinks read
`timeline`     the bounded KV timeline (bytes by state over time, request lanes) and its report JSON
`ledger`       the `Ledger` facade, its lock, and the public methods sources and readers call
=============  ==============================================================================================
"""

from kvguardian.ledger.events import EVENT_KINDS, Event
from kvguardian.ledger.ledger import Ledger
from kvguardian.ledger.records import NO_FILL, NO_GRAD, EntrySite, EntryState, EntryView, Record, RequestInfo, Update
from kvguardian.ledger.snapshot import LedgerSnapshot
from kvguardian.ledger.totals import LedgerTotals

__all__ = [
    "EVENT_KINDS",
    "NO_FILL",
    "NO_GRAD",
    "EntrySite",
    "EntryState",
    "EntryView",
    "Event",
    "Ledger",
    "LedgerSnapshot",
    "LedgerTotals",
    "Record",
    "RequestInfo",
    "Update",
]
