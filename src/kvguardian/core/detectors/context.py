"""What every detector is given besides the snapshot, and the helpers the holder-chain detectors share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvguardian.core.findings import Finding
from kvguardian.core.ledger import LedgerSnapshot, Record
from kvguardian.core.tensors.holders import HolderChain

__all__ = ["DetectContext", "Detector", "best_chain", "chain_evidence", "held_finding"]


@dataclass(frozen=True)
class DetectContext:
    """What a detector may read besides the snapshot."""

    holder_chains: Mapping[Any, HolderChain] = field(default_factory=dict)  # entry key -> chain
    growth_alpha: float = 1e-5  # significance level of the growth trend test
    growth_min_bytes: int = 0  # ignore growth smaller than this over the tested window
    options: Mapping[str, Any] = field(default_factory=dict)


Detector = Callable[[LedgerSnapshot, DetectContext], list[Finding]]


def best_chain(records: Iterable[Record], ctx: DetectContext) -> HolderChain | None:
    """The first complete holder chain among ``records`` (in order), else the first incomplete one."""
    chain = None
    for rec in records:
        c = ctx.holder_chains.get(rec.key)
        if c is not None and (chain is None or (c.complete and not chain.complete)):
            chain = c
            if c.complete:
                break
    return chain


def chain_evidence(chain: HolderChain | None) -> tuple[dict[str, Any], str]:
    """The evidence fields every holder-chain finding carries, and the ", held by ..." clause of its message."""
    ev: dict[str, Any] = {
        "holder_root": chain.root if chain is not None else None,
        "holder_complete": chain.complete if chain is not None else False,
    }
    if chain is not None and chain.notes:
        ev["holder_notes"] = chain.notes
    if chain is None:
        return ev, ""
    if chain.complete:
        return ev, f", held by {chain.steps[0]}"
    return ev, (f", {chain.steps[0]}" if chain.root == "c" else "")


def held_finding(finding: Finding, records: Iterable[Record], ctx: DetectContext, tail: str = "") -> Finding:
    """``finding`` about ``records`` still alive, with their best holder chain: its evidence fields after the
    detector's, its ", held by ..." clause then ``tail`` after the message, and its steps as the holder chain."""
    chain = best_chain(records, ctx)
    chain_ev, held_by = chain_evidence(chain)
    finding.message = f"{finding.message}{held_by}{tail}"
    finding.evidence = {**finding.evidence, **chain_ev}
    finding.holder_chain = list(chain.steps) if chain is not None else None
    return finding
