"""The check pipeline: what ``guard.check()`` does, in order.

1. **settle and snapshot**: end the open implicit requests (when asked), a full GC pass, declared retention
   re-examined, every source synced, then one `LedgerSnapshot`;
2. **holder chains**: for orphaned KV and KV of retired generations, the references that keep each storage
   alive (bounded in time; the sources' live caches are where a search starts when they hold the storage);
3. **retention verdicts**: for each ended owner, is its KV held by a collection that grows with requests
   (`kvguardian.runtime.retention`);
4. **detectors**: every registered detector over the snapshot and what steps 2-3 found
   (`kvguardian.core.detectors`, one module per finding id);
5. **the report**: the findings and the summary.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvguardian.core.detectors import DetectContext, run_all
from kvguardian.core.detectors.stale_generation import stale_records
from kvguardian.core.findings import Report
from kvguardian.core.ledger import EntryState, LedgerSnapshot
from kvguardian.runtime.sources.host import chain_hints

if TYPE_CHECKING:
    from kvguardian.core.tensors.holders import HolderChain
    from kvguardian.runtime.retention import RetentionMonitor
    from kvguardian.runtime.sources.scope import RequestScope

__all__ = ["CheckOptions", "holder_chains", "run_check"]


@dataclass(frozen=True)
class CheckOptions:
    """How one check runs."""

    holder_chains: bool = True  # search holder chains (needs torch loaded; otherwise skipped)
    holder_search_seconds: float = 3.0  # time bound of the search
    redact: bool = False  # hide dictionary keys in holder chains
    growth_alpha: float = 1e-5  # significance level of the KVG103 trend test
    end_implicit: bool = False  # first end the open requests of manually driven caches (the program is done)


def run_check(scope: RequestScope, retention: RetentionMonitor, options: CheckOptions,
              summarize: Callable[[LedgerSnapshot], dict[str, Any]]) -> Report:
    """Run the pipeline over ``scope``'s ledger and sources; ``summarize`` makes the report's summary."""
    if options.end_implicit:
        scope.end_implicit_requests()
    scope.settle()
    scope.declared.refresh()
    snap = scope.snapshot()
    chains = holder_chains(snap, scope, options) if options.holder_chains else {}
    verdicts = retention.classify(snap, chains) if chains else {}
    ctx = DetectContext(holder_chains=chains, growth_alpha=options.growth_alpha, options={"retention": verdicts})
    return Report(findings=run_all(snap, ctx), summary=summarize(snap))


def holder_chains(snap: LedgerSnapshot, scope: RequestScope, options: CheckOptions) -> Mapping[Any, HolderChain]:
    """Storage key -> holder chain, for the orphaned entries of ``snap`` and those of retired generations."""
    keys = [r.key for r in snap.records if r.state is EntryState.ORPHANED]
    keys += [r.key for r in stale_records(snap) if r.state is not EntryState.ORPHANED]
    if not keys or "torch" not in sys.modules:
        return {}
    from kvguardian.core.tensors.holders import find_holder_chains

    seeds, suffixes = _seeds(scope, snap)
    hints = chain_hints(scope.sources(), [r for r in snap.records if r.state is EntryState.ORPHANED])
    chains = find_holder_chains(
        [k for k in keys if isinstance(k, int) and k not in seeds],
        seeds=seeds,
        exclude=scope.auditor_objects(),
        hints=hints,
        max_seconds=options.holder_search_seconds,
        redact=options.redact,
        collect=False,
    )
    seeds.clear()  # the live caches and the hints: not kept past the search
    hints.clear()
    for key, suffix in suffixes.items():
        ch = chains.get(key)
        if ch is not None and ch.steps:
            ch.steps[-1:] = suffix
    return chains


def _seeds(scope: RequestScope, snap: LedgerSnapshot) -> tuple[dict[Any, Any], dict[Any, list[str]]]:
    """Every source's chain seeds, merged: storage key -> the live object where its search starts, and the steps
    from that object down to the storage. (Merged here so no other dict refers to the objects during the search:
    it would show up as their holder.)"""
    seeds: dict[Any, Any] = {}
    suffixes: dict[Any, list[str]] = {}
    for source in scope.sources():
        found, steps = source.chain_seeds(snap.records)
        seeds.update(found)
        suffixes.update(steps)
    return seeds, suffixes
