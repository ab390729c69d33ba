"""Bounded walks of autograd graphs: how many nodes, and how many bytes of saved tensors they keep alive."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch

__all__ = ["GraphStats", "walk_graph"]

# Per node type, the names of its `_saved_*` attributes (dir() is slow; node types are few).
_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}


def _saved_attrs(node: Any) -> tuple[str, ...]:
    t = type(node)
    names = _SAVED_ATTRS.get(t)
    if names is None:
        names = tuple(n for n in dir(node) if n.startswith("_saved_") and not n.endswith("_raw"))
        _SAVED_ATTRS[t] = names
    return names


@dataclass
class GraphStats:
    """What a walk from some tensors' ``grad_fn`` found."""

    nodes: int = 0  # autograd nodes visited
    saved_tensors: int = 0  # distinct storages saved for backward
    saved_bytes: int = 0  # their bytes, each storage once
    truncated: bool = False  # the walk hit its node or time bound
    node_types: dict[str, int] = field(default_factory=dict)
    storage_keys: set[int] = field(default_factory=set)

    def to_evidence(self, top: int = 5) -> dict[str, Any]:
        common = sorted(self.node_types.items(), key=lambda kv: -kv[1])[:top]
        return {
            "graph_nodes": self.nodes,
            "saved_tensors": self.saved_tensors,
            "saved_bytes": self.saved_bytes,
            "walk_truncated": self.truncated,
            "node_types": dict(common),
        }


def walk_graph(
    tensors: torch.Tensor | Iterable[torch.Tensor],
    *,
    max_nodes: int = 100_000,
    max_seconds: float = 5.0,
    exclude_keys: set[int] | None = None,
) -> GraphStats:
    """Walk ``grad_fn.next_functions`` from ``tensors`` and sum the storages saved in ``_saved_*`` attributes.

    ``exclude_keys``: storage keys not to count as saved (e.g. the cache tensors themselves).
    Bounded by ``max_nodes`` and ``max_seconds``; ``truncated`` says whether a bound was hit.
    """
    import torch

    stats = GraphStats()
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    seen: set[int] = set()
    keep: list[Any] = []  # node wrappers are created on access: hold them so ids stay unique during the walk
    queue: deque[Any] = deque()
    for t in tensors:
        fn = getattr(t, "grad_fn", None)
        if fn is not None and id(fn) not in seen:
            seen.add(id(fn))
            queue.append(fn)
    exclude = exclude_keys or set()
    deadline = time.monotonic() + max_seconds
    while queue:
        if stats.nodes >= max_nodes or (stats.nodes & 255 == 0 and time.monotonic() > deadline):
            stats.truncated = True
            break
        node = queue.popleft()
        keep.append(node)
        stats.nodes += 1
        name = type(node).__name__
        stats.node_types[name] = stats.node_types.get(name, 0) + 1
        for attr in _saved_attrs(node):
            try:
                value = getattr(node, attr)
            except Exception:  # freed saved variables raise on access
                continue
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, torch.Tensor):
                    st = v.untyped_storage()
                    key = st.data_ptr()
                    if key and key not in stats.storage_keys and key not in exclude:
                        stats.storage_keys.add(key)
                        stats.saved_tensors += 1
                        stats.saved_bytes += st.nbytes()
        for nxt, _ in getattr(node, "next_functions", ()) or ():
            if nxt is not None and id(nxt) not in seen:
                seen.add(id(nxt))
                queue.append(nxt)
    return stats
