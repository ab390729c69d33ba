"""The ledger: the one record of KV entries and their lifecycle events.

Modules: `records` (an entry and a request), `table` (the live index and every state change), `tensors` (the
per-step tensor path), `events` (the bounded buffer), `releases` (storage deaths), `totals` (for scrapes),
`snapshot` (what detectors read), `timeline` (bytes by state over time) and `ledger` (the `Ledger` facade).
What each owns: docs/design/ledger.md.
"""

from kvguardian.core.ledger.events import EVENT_KINDS, Event
from kvguardian.core.ledger.ledger import Ledger
from kvguardian.core.ledger.records import (
    NO_FILL,
    NO_GRAD,
    EntrySite,
    EntryState,
    EntryView,
    Record,
    RequestInfo,
    Update,
)
from kvguardian.core.ledger.snapshot import LedgerSnapshot
from kvguardian.core.ledger.totals import LedgerTotals

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
