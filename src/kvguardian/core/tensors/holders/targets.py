"""Where the search starts: the Python objects on each target KV storage.

Every Python tensor on the storage is a start (a view and its base are two; a base kept alive only by its
view's C++ link has no Python holder of its own), and so is a tensor whose autograd graph saved the storage
for backward (the Python tensor on a saved storage may exist only because PyTorch preserves it). With
seeds (storage key -> an object known to hold it, e.g. its cache), the seed is the start.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Starts", "find_starts"]

_PER_STORAGE = 16  # Python tensors kept per storage


@dataclass
class Starts:
    objects: dict[int, Any] = field(default_factory=dict)  # id -> object (strong, only during the search)
    by_key: dict[Any, list[int]] = field(default_factory=dict)  # storage key -> ids of the objects on it
    grad_edge: dict[int, Any] = field(default_factory=dict)  # id(tensor whose graph saved it) -> storage key

    def add(self, key: object, obj: object) -> None:
        ids = self.by_key.setdefault(key, [])
        if id(obj) not in ids:
            ids.append(id(obj))
        self.objects.setdefault(id(obj), obj)


def find_starts(targets: set[Any], seeds: dict[Any, Any], deadline: float) -> Starts:
    import torch

    starts = Starts()
    for key, obj in seeds.items():
        starts.add(key, obj)
    unseeded = targets - set(seeds)
    if not unseeded:
        return starts
    grad_tensors: list[Any] = []
    tensor_type = torch.Tensor
    for obj in gc.get_objects():
        if not issubclass(type(obj), tensor_type):  # type(), not isinstance(): no __class__ lookups
            continue
        try:
            key = obj.untyped_storage().data_ptr()
        except Exception:
            continue
        if key in unseeded:
            if len(starts.by_key.get(key, ())) < _PER_STORAGE:
                starts.add(key, obj)
        elif obj.grad_fn is not None:
            grad_tensors.append(obj)
    _autograd_starts(starts, grad_tensors, unseeded, deadline)
    return starts


def _autograd_starts(starts: Starts, grad_tensors: list[Any], unseeded: set[Any], deadline: float) -> None:
    if not grad_tensors:
        return
    from kvguardian.core.tensors.autograd import walk_graph

    for t in grad_tensors:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        stats = walk_graph(t, max_nodes=20_000, max_seconds=min(left, 5.0))
        for key in stats.storage_keys & unseeded:
            starts.add(key, t)
            starts.grad_edge[id(t)] = key
