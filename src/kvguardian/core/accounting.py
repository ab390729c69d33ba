"""Live KV accounting from a ledger snapshot: bytes per request, tenant, layer, KV head, sequence length and
attention role, and allocated-vs-filled for static caches. A pure function of the snapshot (a sink input).

Bytes are *storage* bytes: a storage kept alive by a cropped or windowed view counts at its full size, once,
however many views of it exist; the part of it that holds no token is in ``unused_bytes``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kvguardian.core.ledger import LedgerSnapshot

__all__ = ["kv_accounting", "seq_bucket"]


def seq_bucket(n: int | None) -> str:
    """Power-of-two bucket label of a sequence length: 1, 2, 3-4, 5-8, ..., or "unknown"."""
    if n is None:
        return "unknown"
    if n <= 2:
        return str(max(n, 0))
    hi = 1 << (n - 1).bit_length()
    return f"{hi // 2 + 1}-{hi}"


def _top(d: dict[Any, int], top: int) -> dict[str, int]:
    items = sorted(d.items(), key=lambda kv: -kv[1])
    out = {str(k): v for k, v in items[:top]}
    rest = sum(v for _, v in items[top:])
    if rest:
        out[f"<{len(items) - top} more>"] = rest
    return out


def kv_accounting(snapshot: LedgerSnapshot, *, top: int = 50) -> dict[str, Any]:
    """Live KV bytes by request, tenant, layer, KV head, sequence length and role; static caches' fill."""
    by_request: dict[Any, int] = defaultdict(int)
    by_tenant: dict[Any, int] = defaultdict(int)
    by_role: dict[Any, int] = defaultdict(int)
    by_seq: dict[str, int] = defaultdict(int)
    by_head: dict[int, float] = defaultdict(float)
    layers: dict[Any, dict[str, Any]] = {}
    static_alloc = static_filled = 0
    views = {"entries": 0, "storage_bytes": 0, "view_bytes": 0}
    for r in snapshot.records:
        b = r.storage_bytes
        by_request[r.request_id or "<none>"] += b
        by_tenant[r.tenant or "<none>"] += b
        by_role[r.role or "decoder"] += b
        seq = r.filled_tokens if r.filled_tokens is not None else r.seq_len
        by_seq[seq_bucket(seq)] += b
        heads = r.kv_heads
        if heads:
            for h in range(heads):
                by_head[h] += b / heads
        lay = layers.setdefault(r.layer if r.layer is not None else "<none>", {
            "bytes": 0, "entries": 0, "kv_heads": heads, "max_seq_len": 0, "unused_bytes": 0})
        lay["bytes"] += b
        lay["entries"] += 1
        lay["unused_bytes"] += r.unused_bytes
        if seq is not None:
            lay["max_seq_len"] = max(lay["max_seq_len"], seq)
        if r.capacity_tokens:
            static_alloc += b
            static_filled += b - r.unused_bytes
        elif r.logical_bytes < b:
            views["entries"] += 1
            views["storage_bytes"] += b
            views["view_bytes"] += r.logical_bytes
    for lay in layers.values():
        tokens = lay["max_seq_len"]
        lay["bytes_per_token"] = round(lay["bytes"] / tokens, 1) if tokens else None
    frag = (static_alloc - static_filled) / static_alloc if static_alloc else 0.0
    return {
        "total_bytes": snapshot.total_bytes(),
        "by_request": _top(by_request, top),
        "by_tenant": _top(by_tenant, top),
        "by_role": dict(by_role),
        "by_layer": {str(k): v for k, v in sorted(layers.items(), key=lambda kv: str(kv[0]))},
        "by_kv_head": {str(h): round(v) for h, v in sorted(by_head.items())},
        "by_seq_len": dict(sorted(by_seq.items(), key=lambda kv: _bucket_key(kv[0]))),
        "static": {
            "allocated_bytes": static_alloc,
            "filled_bytes": static_filled,
            "fragmentation_ratio": round(frag, 6),
        },
        "cropped_views": views,
        "fragmentation_ratio": round(snapshot.fragmentation_ratio(), 6),
    }


def _bucket_key(label: str) -> int:
    head = label.split("-")[0]
    return int(head) if head.isdigit() else 1 << 62
