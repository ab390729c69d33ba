"""The paged mini engine (`kvguardian.runtime.paged.engine.Engine`) wired to an `OOMGuard`.

    guard_engine(oom, engine, preempt=True)

- the pool's occupancy is a signal, and every allocation of the pool samples;
- the pool's unreferenced prefix-cache blocks are the first thing evicted (under ``engine.lock``) when the
  pool's occupancy or a KV budget is the pressure (a preallocated pool's cached blocks hold no memory of
  their own);
- with ``preempt``, the last eviction step preempts the newest running request (recomputed later);
- with ``shed``, memory that still rises while draining ends the newest requests (``seq.error`` set: the
  server answers 503 + Retry-After and the client retries).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvguardian.ops.oom.guard import OOMGuard

if TYPE_CHECKING:
    from kvguardian.runtime.paged.engine import Engine

__all__ = ["guard_engine"]


def guard_engine(oom: OOMGuard, engine: Engine, *, name: str = "main", preempt: bool = False,
                 shed: bool = True) -> OOMGuard:
    oom.watch_pool(engine.pool, name=name, lock=engine.lock)
    if preempt:  # preempted requests give their blocks back to the preallocated pool: no host or GPU memory
        oom.on_preempt(engine.request_preempt, relieves=lambda signal: signal in (f"pool:{name}", "kv_budget"))
    if shed:
        oom.on_shed(engine.request_shed)
    return oom
