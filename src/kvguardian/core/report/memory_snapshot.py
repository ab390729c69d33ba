"""The KV lifecycle as a PyTorch memory snapshot: what ``torch.cuda.memory._snapshot()`` returns, so PyTorch's
own viewer shows our KV history::

    kv-guardian report run.json --memory-snapshot kv.pickle
    python -m torch.cuda._memory_viz trace_plot kv.pickle -o kv.html    # the active-memory timeline

Each KV entry is one allocation with synthetic addresses; frames name its kind, layer, request and, for KV
that outlived its request, the holder chain. The file is a pickle of plain types only, with no KV data or
prompt text. The mapping: docs/design/report.md.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvguardian.core.report.history import AliveEntry, History, KVEvent

__all__ = ["SnapshotAudit", "memory_snapshot", "write_memory_snapshot"]

BASE = 0x7F00_0000_0000  # below 2**53: JavaScript reads addresses as numbers
ALIGN = 512
PROTOCOL = 4  # the viewer's unpickler reads protocols 2-4


@dataclass(frozen=True)
class SnapshotAudit:
    """One audit to export: a label (a process, a test), its history, and request id -> holder chain."""

    label: str
    history: History
    chains: Mapping[str, Sequence[str]]


def _frame(filename: str, line: int | None, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": int(line or 0), "name": name}


class _Addresses:
    def __init__(self) -> None:
        self.next = BASE
        self.by_entry: dict[tuple[int, int], int] = {}

    def of(self, audit: int, entry: int, size: int) -> int:
        key = (audit, entry)
        addr = self.by_entry.get(key)
        if addr is None:
            addr = self.by_entry[key] = self.next
            self.next += max(ALIGN, -(-size // ALIGN) * ALIGN)
        return addr


def _sizes(hist: History) -> dict[int, int]:
    """Each entry's size: the largest seen (a storage grows while decoding; its release reports the last)."""
    sizes: dict[int, int] = {}
    for e in hist.events:
        if e.scope == "entry" and e.entry:
            sizes[e.entry] = max(sizes.get(e.entry, 0), e.bytes)
    for a in hist.entries:
        sizes[a.entry] = max(sizes.get(a.entry, 0), a.bytes)
    return sizes


def _owner(request: str | None, tenant: str | None) -> str:
    return f"request {request}" + (f" (tenant {tenant})" if tenant else "") if request else "no request"


def _alloc_frames(label: str, layer: int | None, kind: str, owner: str, cache: str | None) -> list[dict[str, Any]]:
    what = f"KV {kind} of layer {layer}" if layer is not None else f"KV {kind}"
    return [_frame(cache or "kv-guardian", layer, f"{what} of {owner}"), _frame(label, 0, owner)]


def _held_frames(chain: Sequence[str]) -> list[dict[str, Any]]:
    steps = list(chain)
    return [_frame("held by", len(steps) - i, step) for i, step in enumerate(reversed(steps))]


def _us(hist: History, t: float) -> int:
    base = hist.origin_unix if hist.origin_unix is not None else hist.origin
    return int((base + t) * 1e6)


def _trace(n: int, audit: SnapshotAudit, addrs: _Addresses) -> list[dict[str, Any]]:
    hist = audit.history
    sizes = _sizes(hist)
    out: list[dict[str, Any]] = []
    allocated: set[int] = set()
    for e in sorted((e for e in hist.events if e.scope == "entry" and e.entry), key=lambda e: e.t):
        size = sizes.get(e.entry, e.bytes)
        if size <= 0:
            continue
        addr = addrs.of(n, e.entry, size)
        common = {"addr": addr, "size": size, "stream": 0, "time_us": _us(hist, e.t)}
        if e.kind == "init" and e.entry not in allocated:
            allocated.add(e.entry)
            out.append({"action": "alloc", **common, "frames": _alloc_frames(
                audit.label, e.layer, "entry", _owner(e.request, e.tenant), e.cache)})
        elif e.kind == "release":
            allocated.discard(e.entry)
            frames = [_frame("kv-guardian", e.layer, f"released ({_detail(e)})")]
            out.append({"action": "free_requested", **common, "frames": frames})
            out.append({"action": "free_completed", **common, "frames": frames})
    return out


def _detail(e: KVEvent) -> str:
    return e.detail or "storage freed"


def _segment(n: int, audit: SnapshotAudit, a: AliveEntry, size: int, addrs: _Addresses) -> dict[str, Any]:
    addr = addrs.of(n, a.entry, size)
    frames = _alloc_frames(audit.label, a.layer, a.kind, _owner(a.request, a.tenant), None)
    chain = audit.chains.get(a.request) if a.request is not None and a.state != "live" else None
    if chain:
        frames = _held_frames(chain) + frames
    frames.insert(0, _frame("state", 0, f"{a.state} at the report"))
    block = {"address": addr, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames}
    return {"device": 0, "address": addr, "total_size": size, "allocated_size": size, "active_size": size,
            "requested_size": size, "stream": 0, "segment_type": "large" if size > 1 << 20 else "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": [block]}


def memory_snapshot(audits: Sequence[SnapshotAudit]) -> dict[str, Any]:
    """The snapshot dict of ``audits`` (all on device 0, one address range per entry)."""
    addrs = _Addresses()
    trace: list[dict[str, Any]] = []
    segments: list[dict[str, Any]] = []
    for n, audit in enumerate(audits):
        trace.extend(_trace(n, audit, addrs))
        sizes = _sizes(audit.history)
        for a in audit.history.entries:
            size = sizes.get(a.entry, a.bytes)
            if size > 0:
                segments.append(_segment(n, audit, a, size, addrs))
    trace.sort(key=lambda e: e["time_us"])
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {}}


def write_memory_snapshot(audits: Sequence[SnapshotAudit], path: str | Path) -> int:
    """Pickle the snapshot of ``audits`` to ``path``; returns the bytes written."""
    body = pickle.dumps(memory_snapshot(audits), protocol=PROTOCOL)
    Path(path).write_bytes(body)
    return len(body)
