"""The search: backwards from the start objects, level by level, keeping every referrer it finds.

Each level asks the garbage collector for the referrers of the whole frontier; one breadth-first pass over the
discovered graph then gives the shortest chain from a root to every start, the same on any machine. It stops
when every chain is proven shortest, nothing is left, or the object budget runs out (the chain says so).
*Hints* join the first level to save scans, never changing a chain. Details: docs/design/tensors.md.
"""

from __future__ import annotations

import collections
import gc
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvguardian.core.tensors.holders.refcounts import frontier_holders, fully_accounted, held_within
from kvguardian.core.tensors.holders.roots import Roots, class_namespace, global_label, untracked_holders

__all__ = ["Budget", "Fence", "Graph", "nearest_top", "root_distances", "search", "walk"]

_PROBE = 4  # frontier objects a probing scan asks about (`_probed`)
_PROBING = [True]  # cleared for the process once a probe's counts did not prove the rest
_BULK = 600  # above this many frontier objects, one pass over the heap beats gc.get_referrers' O(edges × n)
_KIND_ORDER = {"module": 0, "class": 1, "frame": 2, "context": 3, "asyncio": 4, "interpreter": 5}


@dataclass(frozen=True)
class Budget:
    """Bounds of one search: objects visited (the real bound: the same on any machine) and a generous
    wall-clock safety net."""

    max_objects: int = 100_000
    max_seconds: float = 60.0
    # look for holders the garbage collector does not track (one more heap pass, only when a start has no
    # referrer at all); sampling at request ends leaves it to the final check
    untracked: bool = True


@dataclass
class Graph:
    """What the search found: objects, every parent of each, and the objects held directly by a root."""

    objs: dict[int, Any] = field(default_factory=dict)  # id -> object (strong, only during the search)
    parents: dict[int, list[int]] = field(default_factory=dict)
    children: dict[int, list[int]] = field(default_factory=dict)  # in the order the references were found
    root_of: dict[int, tuple[str, str]] = field(default_factory=dict)  # id -> (root kind, label)
    stopped_at: int | None = None  # objects visited when the budget ran out
    stop_reason: str = ""

    def link(self, parent: int, child: int) -> None:
        ps = self.parents.setdefault(child, [])
        if parent not in ps:
            ps.append(parent)
            self.children.setdefault(parent, []).append(child)

    def set_root(self, node: int, kind: str, label: str) -> None:
        old = self.root_of.get(node)
        new = (kind, label)
        if old is None or _root_key(new) < _root_key(old):
            self.root_of[node] = new

    def clear(self) -> None:
        self.objs.clear()
        self.parents.clear()
        self.children.clear()


def _root_key(root: tuple[str, str]) -> tuple[int, str]:
    return _KIND_ORDER.get(root[0], 9), root[1]


@dataclass(frozen=True)
class Fence:
    """What the search must not walk through: the auditor's own objects, containers and frames."""

    exclude: Iterable[object] = ()  # the guard, its ledger, ...: never a holder
    internal: Iterable[int] = ()  # ids of the caller's containers that hold the starts
    own_dir: str = ""  # frames of code under this folder are the auditor's
    holding: tuple[Any, ...] = ()  # the caller's containers of starts and hints (their references are its own)


@dataclass
class _Level:
    frontier: list[Any]
    ids: set[int]
    internal: set[int]
    exclude: set[int]
    own_dir: str
    # the search's own containers stay alive until it ends, so that no object another thread allocates
    # meanwhile can reuse one's id and be skipped as "internal"
    keep: list[Any] = field(default_factory=list)
    unexpanded: dict[int, Any] = field(default_factory=dict)  # found, referrers not asked for yet
    budget: Budget = field(default_factory=Budget)
    deadline: float = 0.0
    starts: dict[int, Any] = field(default_factory=dict)
    expanded: set[int] = field(default_factory=set)  # ids whose referrers were asked for
    deferred: set[int] = field(default_factory=set)  # fan-in groups left unexpanded to stay in the budget
    shortcut: bool = True  # leave out of a scan the objects whose referrers the reference counts prove known
    # objects the shortcut left out of a scan (their parents may be linked in another order than a scan's)
    reordered: set[int] = field(default_factory=set)
    probing: bool = False  # this level's scan asked about only a few of the objects it could not prove

    def own(self, container: object) -> None:
        self.internal.add(id(container))
        self.keep.append(container)


def search(starts: dict[int, Any], roots: Roots, budget: Budget, fence: Fence, hints: Iterable[Any] = ()) -> Graph:
    """Search backwards from ``starts`` (id -> object) until each start's shortest chain is known; ``hints``
    (objects likely above the starts) are expanded with the first level."""
    attempt = _Attempt(list(hints))
    graph, reordered = _search(starts, roots, budget, fence, attempt)
    if _order_matters(graph, reordered, starts):
        graph.clear()
        attempt.again(roots)
        graph, _ = _search(starts, roots, budget, fence, attempt)
    attempt.likely.clear()
    return graph


def _order_matters(graph: Graph, reordered: set[int], starts: dict[int, Any]) -> bool:
    """Whether the order in which the parents of the ``reordered`` objects were linked can change a chain:
    a start no root reaches, and one of them with two parents of the same type."""
    if not reordered:
        return False
    dist, _ = root_distances(graph)
    if all(s in dist for s in starts):
        return False
    for n in reordered:
        names = [type(graph.objs[p]).__name__ for p in graph.parents.get(n, ())]
        if len(set(names)) < len(names):
            return True
    return False


class _Attempt:
    """One run of the search: its hints, whether it may take the shortcut, and `untracked_holders` run at most
    once (a search run again gets the first run's holders at the same point)."""

    def __init__(self, likely: list[Any]) -> None:
        self.likely = likely
        self.shortcut = True
        self.edges: int | None = None
        self.found: dict[int, list[Any]] = {}

    def untracked(self, roots: Roots) -> int:
        if self.edges is None:
            self.edges = untracked_holders(roots)
            self.found = dict(roots.untracked)
        else:
            roots.untracked.update(self.found)
        return self.edges

    def again(self, roots: Roots) -> None:
        """Run again, every scan a full one."""
        self.shortcut = False
        roots.untracked.clear()  # until the run again reaches the point where the first one looked


def _search(starts: dict[int, Any], roots: Roots, budget: Budget, fence: Fence,
            attempt: _Attempt) -> tuple[Graph, set[int]]:
    graph = Graph()
    graph.objs.update(starts)
    frontier = list(starts.values())
    lv = _Level(frontier, set(), {id(graph.objs), id(starts), *roots.internal_ids(), *fence.internal},
                {id(o) for o in fence.exclude}, fence.own_dir, unexpanded=dict(starts), budget=budget,
                deadline=time.monotonic() + budget.max_seconds, starts=starts,
                shortcut=attempt.shortcut and not gc.get_freeze_count())  # a scan skips frozen objects: no shortcut
    unexpanded = lv.unexpanded
    lv.internal.update((id(lv), id(unexpanded), id(lv.expanded)))
    for own in (lv.keep, graph.objs, starts, unexpanded, attempt.likely, roots.keep, *fence.holding):
        lv.own(own)  # the search's own references (`refcounts` counts them)
    _take_hints(attempt.likely, frontier, lv, graph)
    _label_all(frontier, graph, roots)
    for second_pass in (False, True):
        _levels(frontier, lv, graph, roots)
        unfinished = _unfinished(graph, starts, lv.expanded | lv.deferred)
        if second_pass or graph.stopped_at is not None or not _parentless(
                graph, _ancestors(graph, unfinished) - lv.deferred):
            break
        # an unproven start, or an object above it, that nothing in Python refers to: look once for holders the
        # garbage collector does not track (a numpy array on a tensor's memory holds it through ``.base``; an
        # array of objects holds its items), and go on from the objects they hold
        if not budget.untracked or not attempt.untracked(roots):
            break
        lv.internal.update(map(id, roots.untracked.values()))
        frontier = [o for i, o in graph.objs.items() if i in roots.untracked]
        unexpanded.update((id(o), o) for o in frontier)
    unexpanded.clear()
    lv.keep.clear()
    return graph, lv.reordered


def _label_all(objs: list[Any], graph: Graph, roots: Roots) -> None:
    for o in objs:  # a helper: no loop variable is left holding an object in the searching frame
        _label_if_rooted(o, graph, roots)


def _take_hints(hints: Iterable[Any], frontier: list[Any], lv: _Level, graph: Graph) -> None:
    """Each hint joins the first level, with the plain dicts it refers to (its instance ``__dict__`` when one
    exists: read with ``gc.get_referents``, never materialised), which sit between it and what it holds."""
    for h in hints:
        for o in (h, *(d for d in gc.get_referents(h) if type(d) is dict)):
            if len(frontier) >= _BULK:  # a hint must not turn the first level into the slower bulk pass
                return
            if id(o) not in graph.objs and id(o) not in lv.internal and id(o) not in lv.exclude:
                graph.objs[id(o)] = o
                frontier.append(o)
                lv.unexpanded[id(o)] = o


def _levels(frontier: list[Any], lv: _Level, graph: Graph, roots: Roots) -> None:
    """Expand level by level from ``frontier`` until every start is proven or the budget ends."""
    budget, unexpanded, starts = lv.budget, lv.unexpanded, lv.starts
    while frontier:
        if _charged(graph, lv) >= budget.max_objects or time.monotonic() > lv.deadline:
            graph.stopped_at = len(graph.objs)
            graph.stop_reason = (f"search stopped after {len(graph.objs)} objects" if _charged(graph, lv) >=
                                 budget.max_objects else f"search stopped at its {budget.max_seconds:g} s safety net")
            break
        for i in map(id, frontier):
            unexpanded.pop(i, None)
            lv.expanded.add(i)
        lv.frontier = frontier
        lv.ids = {id(o) for o in frontier}
        lv.own(frontier)
        new = _expand(lv, graph, roots)
        unexpanded.update((id(o), o) for o in new)  # no loop variable left holding an object in this frame
        _defer_fan_in(new, lv, graph)
        open_starts = _unfinished(graph, starts, lv.expanded | lv.deferred if lv.deferred else lv.expanded)
        if not open_starts:
            break
        wanted = _ancestors(graph, open_starts) - lv.deferred
        frontier = [o for i, o in unexpanded.items() if i in wanted]
    if lv.deferred and graph.stopped_at is None and any(s not in root_distances(graph)[0] for s in starts):
        graph.stopped_at = len(graph.objs)  # a start only the deferred objects could lead to: not held from C
        graph.stop_reason = (f"search stopped after {len(graph.objs)} objects ({len(lv.deferred)} back-references "
                             "not followed)")


_FAN_IN = 64  # this many objects of one type referring to one object alone: a fan-in group


def _charged(graph: Graph, lv: _Level) -> int:
    """Objects counted against the budget: those found, less the deferred fan-in groups."""
    return len(graph.objs) - len(lv.deferred)


def _defer_fan_in(new: list[Any], lv: _Level, graph: Graph) -> None:
    """When the objects just found would exhaust the budget, leave unexpanded every group of at least
    ``_FAN_IN`` same-type objects whose one reference in the graph is to the same object: back-references
    (a request's thousands of spans or tokens pointing at it, children at their parent), which almost always
    sit below the object they refer to. The search goes on through the object's other referrers; a chain
    found that way starts at a real root (it is shortest among the chains not through a deferred object),
    and a start only a deferred group could lead to says that the search stopped."""
    if _charged(graph, lv) < lv.budget.max_objects:
        return
    groups: dict[tuple[type, int], list[int]] = {}
    for o in new:
        kids = graph.children.get(id(o), ())
        if len(kids) == 1 and id(o) not in graph.root_of:
            groups.setdefault((type(o), kids[0]), []).append(id(o))
    for ids in groups.values():
        if len(ids) >= _FAN_IN:
            lv.deferred.update(ids)


def _label_if_rooted(obj: object, graph: Graph, roots: Roots) -> None:
    """A found object that a root holds directly (a frame local, a contextvar, a module global) is labelled
    at once: its chain is known without asking for its referrers."""
    held = roots.held.get(id(obj))
    if held is not None:
        graph.set_root(id(obj), *held)
    label = global_label(obj)
    if label is not None:
        graph.set_root(id(obj), "module", label)


def _expand(lv: _Level, graph: Graph, roots: Roots) -> list[Any]:
    """One level: link every referrer of the frontier; return the referrers not seen before."""
    new: list[Any] = []
    lv.own(new)
    refs = _referrers(lv)
    lv.own(refs)
    for r in refs:
        _consider(r, lv, graph, roots, new)
    for o in lv.frontier:
        for task in roots.virtual.get(id(o), ()):
            _consider(task, lv, graph, roots, new)
        for holder in roots.untracked.get(id(o), ()):  # a reference gc.get_referents does not report
            if id(holder) not in lv.internal and id(holder) not in lv.exclude:
                _add(holder, graph, roots, new)
                graph.link(id(holder), id(o))
    return new


def _add(obj: object, graph: Graph, roots: Roots, new: list[Any]) -> None:
    """A referrer found: kept for the next level the first time, and labelled at once when a root holds it."""
    if id(obj) not in graph.objs:
        graph.objs[id(obj)] = obj
        new.append(obj)
        _label_if_rooted(obj, graph, roots)


def _consider(r: Any, lv: _Level, graph: Graph, roots: Roots, new: list[Any]) -> None:
    rid = id(r)
    if rid in lv.internal or rid in lv.exclude:
        return
    if isinstance(r, types.FrameType) and lv.own_dir and r.f_code.co_filename.startswith(lv.own_dir):
        return
    ns = roots.namespaces.get(rid)
    if ns is None and type(r) is dict:
        ns = class_namespace(r)
    if ns is not None:
        kind = "module" if ns.startswith("module ") else "class"
        for k, v in list(r.items()):
            if id(v) in lv.ids:
                graph.set_root(id(v), kind, f"{ns}: {k}")
        return
    hits = [id(c) for c in gc.get_referents(r) if id(c) in lv.ids]
    if not hits:
        return
    _add(r, graph, roots, new)
    for c in hits:
        graph.link(rid, c)


def _referrers(lv: _Level) -> list[Any]:
    if len(lv.frontier) <= _BULK:
        inner = _probed(lv, held_within(lv.frontier)) if lv.shortcut else set()
        refs = _referrers_beside(lv, inner) if inner else None
        return gc.get_referrers(*lv.frontier) if refs is None else refs
    out = []
    ids = lv.ids
    for o in gc.get_objects():
        for c in gc.get_referents(o):
            if id(c) in ids:
                out.append(o)
                break
    return out


def _probed(lv: _Level, inner: set[int]) -> set[int]:
    """``inner`` and, when many other frontier objects are left to scan for, all but the last `_PROBE` of
    them: a scan asked about a few finds the collection that usually holds them all (the dict of sessions),
    and the reference counts then prove the others held by it alone (a scan costs a pass over the heap plus a
    compare per object asked about at every reference; figures in docs/design/tensors.md).
    After a probe the counts did not prove, the process scans in full again (`_PROBING`)."""
    outer = [id(o) for o in lv.frontier if id(o) not in inner]
    lv.probing = len(outer) > 2 * _PROBE and _PROBING[0]
    if not lv.probing:
        return inner
    return inner | set(outer[:-_PROBE])  # the latest are asked about: the request ending now is among them, its
    # output still held by the frames returning it, which no count can show


def _referrers_beside(lv: _Level, inner: set[int]) -> list[Any] | None:
    """The frontier's referrers from a scan of only the objects outside ``inner`` (those other frontier
    objects hold), or None when the reference counts do not prove that the inner ones have no referrer
    beyond the frontier, those the scan returned and the search's own containers."""
    outer = [o for o in lv.frontier if id(o) not in inner]
    lv.own(outer)  # it refers to what the scan asks about: the search's own
    refs = gc.get_referrers(*outer) if outer else []
    refs += frontier_holders(lv.frontier, inner, refs)
    held = [o for o in lv.frontier if id(o) in inner]
    if not fully_accounted(held, [refs, *refs, *lv.frontier, *lv.keep]):
        lv.shortcut = False  # something else holds them: the rest of this search scans in full at once
        if lv.probing:
            _PROBING[0] = False
        return None
    lv.reordered |= inner
    return refs


def root_distances(graph: Graph) -> tuple[dict[int, int], dict[int, int]]:
    """Breadth first from the root-held nodes (in a fixed order: root kind, then label) down the found
    references: each node's distance from a root and the parent on its shortest chain."""
    level0 = sorted(graph.root_of, key=lambda n: _root_key(graph.root_of[n]))
    dist = dict.fromkeys(level0, 0)
    via: dict[int, int] = {}
    queue = collections.deque(level0)
    while queue:
        n = queue.popleft()
        for c in graph.children.get(n, ()):
            if c not in dist:
                dist[c] = dist[n] + 1
                via[c] = n
                queue.append(c)
    return dist, via


def _unfinished(graph: Graph, starts: dict[int, Any], expanded: set[int]) -> set[int]:
    """Starts whose shortest chain is not proven yet. A start's chain of length d is proven when every
    ancestor closer than d was expanded: then every chain of length <= d whose top a root holds directly is
    known (tops are labelled when found); one whose top sits in a namespace dict is known a level later, so
    it can only tie, never be shorter. (Level by level, after n levels that is "a chain of length <= n".)"""
    dist, _ = root_distances(graph)
    return {s for s in starts if s not in dist or not _expanded_below(graph, s, dist[s], expanded)}


def _expanded_below(graph: Graph, start: int, depth: int, expanded: set[int]) -> bool:
    """Whether every ancestor of ``start`` less than ``depth`` references above it was expanded."""
    level = [start]
    seen = {start}
    for _ in range(depth):
        nxt = []
        for n in level:
            if n not in expanded:
                return False
            for p in graph.parents.get(n, ()):
                if p not in seen:
                    seen.add(p)
                    nxt.append(p)
        level = nxt
    return True


def _parentless(graph: Graph, nodes: set[int]) -> bool:
    """Whether one of ``nodes`` has no referrer at all in what the search found."""
    return any(not graph.parents.get(n) for n in nodes)


def _ancestors(graph: Graph, nodes: set[int]) -> set[int]:
    seen = set(nodes)
    stack = list(nodes)
    while stack:
        for p in graph.parents.get(stack.pop(), ()):
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen


def walk(node: int, via: dict[int, int], limit: int = 1_000_000) -> list[int]:
    """The one parent walk: from ``node`` up through ``via`` to its top; returned top first."""
    path = [node]
    seen = {node}
    while node in via and len(path) < limit:
        node = via[node]
        if node in seen:  # pragma: no cover - via is a tree by construction
            break
        seen.add(node)
        path.append(node)
    path.reverse()
    return path


def nearest_top(graph: Graph, start: int, label: Callable[[int], str]) -> tuple[int, dict[int, int]]:
    """For a start no root reaches: breadth first up its parents to the nearest object nothing in Python
    refers to (held from C), ties broken by ``label(node)``; returns it and the child-to-parent links
    (``walk`` them down from the start's side)."""
    below: dict[int, int] = {}  # parent -> the child it was reached from
    frontier = [start]
    seen = {start}
    while frontier:
        tops = [n for n in frontier if not graph.parents.get(n)]
        if tops:
            return min(tops, key=label), below
        nxt = []
        for n in frontier:
            for p in graph.parents.get(n, ()):
                if p not in seen:
                    seen.add(p)
                    below[p] = n
                    nxt.append(p)
        frontier = sorted(nxt, key=label)
    return start, below
