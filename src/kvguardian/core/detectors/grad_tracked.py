"""KVG101 grad-tracked-kv: a KV tensor with ``grad_fn`` or ``requires_grad``.

The guard checks ``requires_grad`` on every cache update (one attribute read). At the first grad-tracked
update of a request it walks the graph (bounded) for evidence; at each later one it checks in O(1) whether
the stored KV's graph chains to the previous step's (the leak). This detector reports, per request:

* **error** from the first step: KV stored with a graph, unless
* later updates showed the graph is *not* chained across steps (the cache is detached between steps, so
  each step's graph is freed): then it is **cleared** and nothing is reported.
"""

from __future__ import annotations

from typing import Any

from kvguardian.core.detectors.context import DetectContext
from kvguardian.core.findings import Finding, Severity
from kvguardian.core.ledger import LedgerSnapshot

__all__ = ["detect", "is_cleared"]


def is_cleared(obs: dict[str, Any]) -> bool:
    """True when a layer was updated with grad at least twice and no update ever chained to the last step."""
    updates = obs.get("layer_updates") or {}
    return obs.get("chained_updates", 0) == 0 and any(n >= 2 for n in updates.values())


def detect(snapshot: LedgerSnapshot, ctx: DetectContext) -> list[Finding]:
    findings = []
    seen: set[Any] = set()
    for obs in snapshot.grad_observations:
        rid = obs.get("request_id")
        seen.add(rid)
        if is_cleared(obs):
            continue
        kv_bytes = sum(r.storage_bytes for r in snapshot.records if r.request_id == rid)
        chained = obs.get("chained_updates", 0)
        ev = {k: v for k, v in obs.items() if k != "layer_updates"}
        ev["grad_updates"] = sum((obs.get("layer_updates") or {}).values())
        ev["live_kv_bytes"] = kv_bytes
        where = f"request {rid!r}" if rid is not None else "an unowned cache"
        chain_txt = (
            f"; {chained} later update(s) chained their graph to the previous step's KV" if chained else ""
        )
        findings.append(
            Finding(
                id="KVG101",
                severity=Severity.ERROR,
                message=(
                    f"KV of {where} is tracked by autograd (layers {sorted(obs.get('layers', []), key=str)}): when "
                    f"first seen (sequence length {obs.get('seq_len_at_detection')}) its graph had "
                    f"{obs.get('graph_nodes')} nodes holding {obs.get('saved_bytes')} bytes of saved tensors"
                    f"{chain_txt}; every decode step's graph stays alive"
                ),
                evidence=ev,
            )
        )
    return findings
