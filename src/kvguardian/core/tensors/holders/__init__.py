"""Holder chains: the path of references from a root to a live KV storage.

A general backward search, not a list of known leak shapes: from the objects on the target storages
(`targets`), the referrers of a whole level are asked for at once (`search`, `refcounts`) until each target's
shortest chain from a root (`roots`) is proven. References are named (`edges`), collections on a chain recorded
(`shapes`). The search is bounded by objects visited, changes nothing (`access`), and never shows KV contents.
Details: docs/design/tensors.md.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from kvguardian.core.tensors.holders import access
from kvguardian.core.tensors.holders.chain import ROOT_KINDS, HolderChain
from kvguardian.core.tensors.holders.edges import node_label, render_step
from kvguardian.core.tensors.holders.render import PathView, render_chain
from kvguardian.core.tensors.holders.roots import collect_roots
from kvguardian.core.tensors.holders.search import Budget, Fence, Graph, nearest_top, root_distances, search, walk
from kvguardian.core.tensors.holders.shapes import declared_bound, is_tensor_like
from kvguardian.core.tensors.holders.targets import Starts, find_starts

__all__ = ["ROOT_KINDS", "Budget", "HolderChain", "SearchOptions", "declared_bound", "find_holder_chains",
           "is_tensor_like", "render_step"]

# src/kvguardian: kv-guardian's own frames and modules are not holders (core/tensors/holders/__init__.py)
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_MAX_OBJECTS = 25_000


@dataclass(frozen=True)
class SearchOptions:
    """How one holder search runs (every field can also be given to `find_holder_chains` by keyword)."""

    max_objects: int = DEFAULT_MAX_OBJECTS  # the budget: objects visited (the same on any machine)
    max_seconds: float = 120.0  # a safety net only
    redact: bool = False  # hide dictionary keys
    collect: bool = True  # gc.collect() first
    all_threads: bool = True  # False: only this thread's frames (sampling inside a running program)
    light: bool = False  # nodes, collections and bounds only, no step names (sampling)


def find_holder_chains(
    target_keys: Iterable[Any],
    *,
    seeds: dict[Any, Any] | None = None,
    exclude: Iterable[object] = (),
    hints: Iterable[Any] = (),
    options: SearchOptions | None = None,
    **fields: Any,
) -> dict[Any, HolderChain]:
    """Find, for each storage key in ``target_keys``, a shortest chain of references from a root.

    Returns a chain for every target; a target no Python root reaches has ``complete=False`` and says why
    (held from C, naming the nearest Python objects; or the budget ran out). With ``seeds`` (key -> object),
    the search starts from those objects (e.g. the caches that hold the KV) instead of scanning the heap for
    the tensors. ``hints`` are objects likely to hold the starts (what each request returned): expanded with
    the first level, they save a heap scan when right and cost nothing to the result when wrong. ``fields``
    are `SearchOptions` fields (``max_seconds=``, ``redact=``, ...).
    """
    opts = replace(options or SearchOptions(), **fields)
    seeds = seeds or {}
    targets = set(target_keys) | set(seeds)
    if not targets:
        return {}
    if opts.collect:
        gc.collect()
    budget = Budget(max_objects=opts.max_objects, max_seconds=opts.max_seconds, untracked=not opts.light)
    starts = find_starts(targets, seeds, time.monotonic() + opts.max_seconds / 2)
    roots = collect_roots(all_threads=opts.all_threads, own_dir=_PKG_DIR)
    graph = Graph()
    likely = list(hints)
    try:
        fence = Fence(exclude=exclude, internal=(id(seeds), id(starts), id(starts.by_key), id(targets), id(likely),
                                                 id(hints)),
                      own_dir=_PKG_DIR, holding=(seeds, likely, *((hints,) if isinstance(hints, list) else ())))
        graph = search(starts.objects, roots, budget, fence, likely)
        dist, via = root_distances(graph)
        return {key: _chain_for(key, starts, graph, (dist, via),
                                PathView([], graph.objs, None, redact=opts.redact, light=opts.light))
                for key in targets}
    finally:
        likely.clear()
        graph.clear()
        roots.clear()
        starts.objects.clear()
        access.clear_caches()


def _chain_for(key: object, starts: Starts, graph: Graph, shortest: tuple[dict[int, int], dict[int, int]],
               view: PathView) -> HolderChain:
    cands = starts.by_key.get(key, [])
    if not cands:
        return HolderChain(steps=["<no Python object holds this storage>"], root="none", complete=False,
                           notes=["held from C/C++ (an extension, torch.compile, a C++ autograd node) or freed "
                                  "meanwhile"])
    dist, via = shortest
    reached = [c for c in cands if c in dist]
    if reached:
        best = min(reached, key=dist.__getitem__)
        view.path = walk(best, via)
        view.root = graph.root_of[view.path[0]]
    else:
        best = cands[0]
        top, below = nearest_top(graph, best, lambda n: node_label(graph.objs[n]))
        view.path = list(reversed(walk(top, below)))
        view.stopped = graph.stop_reason
    view.grad_edge = best in starts.grad_edge
    view.tail = _describe(graph.objs[best])
    return render_chain(view)


def _describe(obj: object) -> str:
    if not is_tensor_like(obj):
        return type(obj).__name__
    try:
        shape = "×".join(str(s) for s in obj.shape)
        return f"Tensor[{shape}] {str(obj.dtype).replace('torch.', '')}"
    except Exception:  # pragma: no cover - exotic tensor subclasses
        return type(obj).__name__
