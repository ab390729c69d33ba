"""Storage identity helpers and a bounded walk that finds the tensors an object holds."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["is_tensor", "reachable_tensors", "storage_key", "storage_nbytes"]


def is_tensor(obj: object) -> bool:
    """True for a torch.Tensor, without importing torch when it is not loaded."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def storage_key(t: torch.Tensor) -> int:
    """The ledger key of a tensor: its storage's data pointer (0 for an empty storage)."""
    return int(t.untyped_storage().data_ptr())


def storage_nbytes(t: torch.Tensor) -> int:
    return int(t.untyped_storage().nbytes())


_SKIP_TYPES = (type, type(sys), type(len))  # classes, modules, builtins: never part of a data structure


def reachable_tensors(root: object, *, max_objects: int = 200_000) -> Iterator[Any]:
    """Tensors reachable from ``root`` through Python references (containers, attributes, closures).

    Does not descend into classes, modules or functions' globals; bounded by ``max_objects`` visits.
    """
    seen: set[int] = set()
    stack: list[object] = [root]
    visited = 0
    while stack and visited < max_objects:
        obj = stack.pop()
        oid = id(obj)
        if oid in seen:
            continue
        seen.add(oid)
        visited += 1
        if is_tensor(obj):
            yield obj
            continue
        if isinstance(obj, (_SKIP_TYPES, str, bytes, int, float, bool)):
            continue
        if callable(obj) and hasattr(obj, "__globals__"):
            # a function: follow its closure and defaults, not its module globals
            for cell in getattr(obj, "__closure__", None) or ():
                stack.append(cell)
            stack.extend(getattr(obj, "__defaults__", None) or ())
            continue
        stack.extend(gc.get_referents(obj))
