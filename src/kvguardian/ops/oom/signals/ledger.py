"""The ledger's KV bytes against a KV budget (the article's per-pod ``NV_GPU_KV_CACHE_MB``).

used = every KV byte the ledger tracks and has not seen freed (live, retained and orphaned entries: all
of them hold memory); limit = the budget (`kvguardian.ops.oom.budget`). Evicting retained caches and cached pool
blocks (fed to the ledger) lowers it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvguardian.core.errors import UsageError
from kvguardian.ops.oom.signals.base import Reading, failed

if TYPE_CHECKING:
    from kvguardian.core.ledger import Ledger

__all__ = ["LedgerBudgetSignal"]


class LedgerBudgetSignal:
    fast = False

    def __init__(self, ledger: Ledger, budget_bytes: int, *, source: str = "argument", name: str = "kv_budget") -> None:
        if not isinstance(budget_bytes, int) or budget_bytes <= 0:
            raise UsageError(f"KV budget must be a positive number of bytes, got {budget_bytes!r}; fix: e.g. "
                             "KVG_KV_BUDGET_MB=2048")
        self.ledger = ledger
        self.budget = budget_bytes
        self.source = f"ledger vs budget ({source})"
        self.name = name

    def __repr__(self) -> str:
        return f"<LedgerBudgetSignal {self.budget} B>"

    def read(self) -> Reading:
        try:
            totals = self.ledger.totals()
            return Reading(self.name, int(sum(totals.bytes_by_state.values())), self.budget, self.source)
        except Exception as exc:
            return failed(self.name, self.source, exc)
