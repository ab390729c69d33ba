"""The cross-rank consistency check: gather every rank's per-sequence KV summary and compare (KVG106).

    report = check_ranks(guard)      # a collective: every rank of the group calls it at the same point

Each rank's summary (`kvguardian.core.detectors.rank_divergence.sequence_summary`: ids, bytes, counts, never KV
contents) is gathered with ``all_gather_object``; every rank gets the same report. Call it where the ranks
agree on the schedule (between engine steps). Importing this module does not import torch. Details:
docs/design/guard.md.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kvguardian.core.detectors.rank_divergence import compare, sequence_summary
from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Report

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from kvguardian.runtime.sources.host import Auditable

__all__ = ["check_ranks", "gather_summaries"]


def _dist() -> Any:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise UsageError(
            "check_ranks() needs an initialized torch.distributed process group; fix: call "
            "torch.distributed.init_process_group(...) on every rank first"
        )
    return dist


def gather_summaries(guard: Auditable, *, group: ProcessGroup | None = None,
                     settle: bool = True) -> list[dict[str, Any]]:
    """Every rank's summary, in rank order (a collective over ``group``)."""
    dist = _dist()
    if settle:
        guard.settle()
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    mine = sequence_summary(guard.snapshot(), rank=rank, world_size=world)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    return sorted(gathered, key=lambda s: s["rank"])


def check_ranks(guard: Auditable, *, group: ProcessGroup | None = None, exact_bytes: bool = False,
                settle: bool = True) -> Report:
    """Gather and compare; the same `Report` on every rank (KVG106 findings, one per divergent sequence).

    Args:
        guard: this rank's `Guard` (anything `Auditable`: ``settle()`` and ``snapshot()``).
        group: the process group (default: the world).
        exact_bytes: ranks are replicas, so each sequence's KV bytes must match exactly, not only its
            presence (with tensor-parallel shards of unequal size leave it False).
        settle: run ``gc.collect()`` first (skip it only right after a ``guard.check()``, which settles).

    Raises:
        UsageError: torch.distributed is not initialized.
    """
    t0 = time.perf_counter()
    summaries = gather_summaries(guard, group=group, settle=settle)
    findings = compare(summaries, exact_bytes=exact_bytes)
    return Report(
        findings=findings,
        summary={
            "ranks": len(summaries),
            "sequences_compared": len({sid for s in summaries for sid in s["sequences"]}),
            "bytes_by_rank": {str(s["rank"]): s["total_bytes"] for s in summaries},
            "divergent_sequences": len(findings) + int(findings[-1].evidence.get("more_divergent_sequences", 0))
            if findings else 0,
            "seconds": round(time.perf_counter() - t0, 6),
        },
    )
