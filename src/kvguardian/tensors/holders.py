"""Holder chains: the path of references from a root to a live KV storage.

The search is general, not a list of known leak shapes. It runs backwards from the tensors that own the
target storages, one ``gc.get_referrers`` pass per level (breadth first, so the chain found is a shortest
one), until it reaches a root:

* a module's globals (``module app: SESSIONS``),
* a class's attributes (``class app.Service: encode_prefix``: a ``functools.lru_cache`` on a method),
* a frame that is executing now, in any thread (their locals are not visible to the garbage collector in
  CPython 3.11+, so they are read with ``f_locals`` up front),

Objects in between are whatever holds what: containers, instance attributes, closure cells, frames kept by
tracebacks, generators, ``functools.lru_cache`` entries, and - when no Python object holds a storage - the
autograd graph of a tensor that saved it for backward. The search is bounded in depth, objects and time,
and excludes the guard's own objects and its own frames. Chains never show KV contents, and dictionary keys
are shown only when they look like identifiers (never free text such as a prompt) unless ``redact`` hides
them all.
"""

from __future__ import annotations

import collections
import functools
import gc
import os
import re
import sys
import threading
import time
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HolderChain", "find_holder_chains", "render_step"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SAFE_KEY = re.compile(r"^[\w.:\-/@#]{1,48}$")


@dataclass
class HolderChain:
    """A rendered path from a root to a KV storage."""

    steps: list[str]  # root first, the KV tensor last
    root: str  # "module", "class", "frame", "autograd", "none"
    complete: bool  # True when it starts at a root
    depth: int = 0
    notes: list[str] = field(default_factory=list)
    # additive (issue 3): what `retention` needs to judge whether the holder is bounded
    nodes: list[int] = field(default_factory=list)  # id() of each object on the path, root-most first
    node_steps: list[str] = field(default_factory=list)  # a short label per node (its type, or the step)
    bounds: dict[int, str] = field(default_factory=dict)  # node id -> a declared size bound on that node
    containers: list[int] = field(default_factory=list)  # node ids that are collections (dict, list, set, ...)

    def render(self) -> str:
        return " → ".join(self.steps)


@dataclass
class _Search:
    parent: dict[int, int]  # id(child) -> id(referrer)
    objs: dict[int, Any]  # id -> object, strong refs held only during the search
    root_label: dict[int, str]  # id(child of a root) -> label of the root edge
    grad_edge: set[int]  # ids of tensors that hold a target through their autograd graph
    internal: set[int]  # ids of the search's own containers


def _key_repr(key: object, redact: bool) -> str:
    if isinstance(key, str):
        if not redact and _SAFE_KEY.match(key):
            return repr(key)
        return f"<str len={len(key)}>"
    if isinstance(key, (int, float, bool)) or key is None:
        return "<key>" if redact else repr(key)
    if isinstance(key, tuple):
        return "(" + ", ".join(_key_repr(k, redact) for k in key[:4]) + (", …" if len(key) > 4 else "") + ")"
    return f"<{type(key).__name__}>"


def _describe_tensor(t: Any) -> str:
    try:
        shape = "×".join(str(s) for s in t.shape)
        return f"Tensor[{shape}] {str(t.dtype).replace('torch.', '')}"
    except Exception:  # pragma: no cover - exotic tensor subclasses
        return type(t).__name__


def _short(qualname: str) -> str:
    """``outer.<locals>.Engine.encode`` -> ``Engine.encode``: the part a reader recognises."""
    return qualname.rsplit(".<locals>.", 1)[-1]


def _func_name(fn: Any) -> str:
    return _short(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__)


def _frame_name(frame: types.FrameType) -> str:
    code = frame.f_code
    return f"frame {code.co_name}() ({os.path.basename(code.co_filename)}:{frame.f_lineno})"


def _local_name(frame: types.FrameType, child: Any) -> str | None:
    """The name of ``frame``'s local variable that refers to ``child``, if one does."""
    try:
        for name, v in frame.f_locals.items():
            if v is child:
                return str(name)
    except Exception:  # pragma: no cover
        pass
    return None


def render_step(parent: Any, child: Any, *, redact: bool = False) -> str:
    """Name the edge ``parent → child`` readably: ``list[3]``, ``Engine.cache``, ``frame f() local kv``."""
    if isinstance(parent, dict):
        for k, v in parent.items():
            if v is child:
                return f"dict[{_key_repr(k, redact)}]"
        for k in parent:
            if k is child:
                return "dict key"
        return "dict"
    if isinstance(parent, collections.deque):
        for i, v in enumerate(parent):
            if v is child:
                return f"deque[{i}]"
    if type(parent).__name__ == "_local" and type(parent).__module__ == "_thread":
        return "threading.local (this thread's attributes)"
    if isinstance(parent, functools.partial):
        if child is parent.func:
            return "partial.func"
        if child is parent.keywords:
            return "partial.keywords"
        return "partial"
    if isinstance(parent, (list, tuple)):
        for i, v in enumerate(parent):
            if v is child:
                kind = type(parent).__name__
                if isinstance(child, types.TracebackType):
                    return f"{kind}[{i}] (traceback)"
                return f"{kind}[{i}]"
        return type(parent).__name__
    if isinstance(parent, types.FrameType):
        local = _local_name(parent, child)
        if local is not None:
            return f"{_frame_name(parent)} local {local}"
        if child is parent.f_back:
            return f"{_frame_name(parent)} (caller)"
        return _frame_name(parent)
    if isinstance(parent, types.TracebackType):
        if child is parent.tb_frame:
            return "traceback"
        return "traceback (next)"
    if isinstance(parent, types.CellType):
        return ""  # named by the step before: "function f() closure cell x", or a frame's cell variable
    if isinstance(parent, types.FunctionType):
        if parent.__closure__:
            for i, cell in enumerate(parent.__closure__):
                if cell is child:
                    return f"function {_func_name(parent)}() closure var {parent.__code__.co_freevars[i]}"
        if child is parent.__defaults__:
            return f"function {_func_name(parent)}() defaults"
        return f"function {_func_name(parent)}()"
    if isinstance(parent, types.MethodType):
        return f"bound method {_func_name(parent.__func__)}()" + (" self" if child is parent.__self__ else "")
    if type(parent).__name__ == "_lru_cache_wrapper":
        return f"lru_cache {_func_name(parent)}()"
    if isinstance(parent, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
        kind = {types.GeneratorType: "generator", types.CoroutineType: "coroutine"}.get(type(parent), "async generator")
        frame = next((f for a in ("gi_frame", "cr_frame", "ag_frame") if (f := getattr(parent, a, None))), None)
        local = _local_name(frame, child) if frame is not None else None
        if local is not None:
            return f"{kind} {_short(parent.__qualname__)}() local {local}"
        return f"{kind} {_short(parent.__qualname__)}()"
    if isinstance(parent, BaseException):
        for attr in ("__traceback__", "__context__", "__cause__"):
            if getattr(parent, attr, None) is child:
                return f"{type(parent).__name__}.{attr}"
        if child is parent.args:
            return f"{type(parent).__name__}.args"
    if isinstance(parent, type):
        return f"class {_short(parent.__qualname__)}"
    if isinstance(parent, types.ModuleType):
        return f"module object {parent.__name__}"
    # objects: an attribute, a slot, or something opaque
    d = getattr(parent, "__dict__", None)
    if isinstance(d, dict):
        for name, v in d.items():
            if v is child:
                return f"{type(parent).__name__}.{name}"
        if d is child:
            return f"{type(parent).__name__}.__dict__"
    for cls in type(parent).__mro__:
        for slot in getattr(cls, "__slots__", ()) or ():
            try:
                if getattr(parent, slot) is child:
                    return f"{type(parent).__name__}.{slot}"
            except AttributeError:
                continue
    return type(parent).__name__


def _path_len(node: int, parent: dict[int, int], root_label: dict[int, str]) -> int:
    n = 0
    while node not in root_label and node in parent and n < 10_000:
        node = parent[node]
        n += 1
    return n


def _collapse(a: Any, b: Any, c: Any) -> str | None:
    """Name a two-hop step ``a → b → c`` as one when ``b`` is an implementation detail of ``a``:
    an instance's or class's ``__dict__``, a function's closure tuple, an lru_cache's cache dict."""
    if isinstance(b, dict):
        if isinstance(a, type) or getattr(a, "__dict__", None) is b:
            try:
                names = vars(a)
            except TypeError:
                names = b
            for k, v in names.items():
                if v is c:
                    return f"class {_short(a.__qualname__)}.{k}" if isinstance(a, type) else f"{type(a).__name__}.{k}"
        if type(a).__name__ == "_lru_cache_wrapper":
            return f"lru_cache {_func_name(a)}() cached " + ("result" if any(v is c for v in b.values()) else "key")
    if isinstance(a, functools.partial) and b is a.args:
        for i, v in enumerate(b):
            if v is c:
                return f"partial.args[{i}]"
    if type(a).__name__ == "_local" and isinstance(b, dict) and isinstance(c, dict):
        return "threading.local (one thread's attributes)"
    if isinstance(a, types.FunctionType) and b is a.__closure__ and isinstance(c, types.CellType):
        for i, cell in enumerate(a.__closure__ or ()):
            if cell is c:
                return f"function {_func_name(a)}() closure cell {a.__code__.co_freevars[i]}"
    return None


def _live_frames(skip_own: bool) -> list[types.FrameType]:
    frames: list[types.FrameType] = []
    seen: set[int] = set()
    for frame in sys._current_frames().values():
        f: types.FrameType | None = frame
        while f is not None and id(f) not in seen:
            seen.add(id(f))
            if not (skip_own and f.f_code.co_filename.startswith(_PKG_DIR)):
                frames.append(f)
            f = f.f_back
    return frames


def _thread_name(frame: types.FrameType) -> str:
    for tid, top in sys._current_frames().items():
        f: types.FrameType | None = top
        while f is not None:
            if f is frame:
                if tid == threading.main_thread().ident:
                    return ""
                for th in threading.enumerate():
                    if th.ident == tid:
                        return f" [thread {th.name}]"
                return f" [thread {tid}]"
            f = f.f_back
    return ""


def find_holder_chains(
    target_keys: Iterable[Any],
    *,
    seeds: dict[Any, Any] | None = None,
    exclude: Iterable[object] = (),
    max_depth: int = 40,
    max_seconds: float = 3.0,
    max_frontier: int = 4_096,
    redact: bool = False,
    collect: bool = True,
) -> dict[int, HolderChain]:
    """Find, for each storage key in ``target_keys``, a shortest chain of references from a root.

    Returns a chain for every target; a target with no chain found has ``complete=False`` and a note that
    says why (held only from C/C++, or a bound was hit). With ``seeds`` (key -> object), the search starts
    from those objects (e.g. the cache objects that hold the KV) instead of scanning for the tensors: much
    cheaper, used for sampling at request ends.
    """
    import torch

    targets = set(target_keys) | set(seeds or ())
    if not targets:
        return {}
    if collect:
        gc.collect()
    deadline = time.monotonic() + max_seconds
    excluded = {id(o) for o in exclude}
    objs: dict[int, Any] = {}
    parent: dict[int, int] = {}
    root_label: dict[int, str] = {}
    holder_tensor: dict[int, int] = {}  # storage key -> id(the Python tensor on it)
    candidates: dict[int, list[int]] = {}  # storage key -> ids of objects that hold it (tensor, grad tensors)
    grad_edge: dict[int, int] = {}  # id(tensor whose graph saves the storage) -> storage key
    internal: set[int] = set()

    # 1. the Python tensors that own each target storage
    frontier: list[Any] = []
    grad_tensors: list[Any] = []
    tensor_type = torch.Tensor
    if seeds:
        internal.add(id(seeds))
        for key, obj in seeds.items():
            holder_tensor[key] = id(obj)
            candidates.setdefault(key, []).append(id(obj))
            if id(obj) not in objs:
                objs[id(obj)] = obj
                frontier.append(obj)
    unseeded = targets - set(seeds or ())
    for obj in (gc.get_objects() if unseeded else ()):
        if issubclass(type(obj), tensor_type):  # type(), not isinstance(): no __class__ lookups
            try:
                key = obj.untyped_storage().data_ptr()
            except Exception:
                continue
            if key in targets:
                # every Python tensor on the storage (a view and its base are two; a base kept alive only by
                # its view's C++ link has no Python holder of its own): the chain starts from whichever
                # reaches a root first
                same = candidates.setdefault(key, [])
                if len(same) < 16:
                    same.append(id(obj))
                    holder_tensor.setdefault(key, id(obj))
                    objs[id(obj)] = obj
                    frontier.append(obj)
            elif obj.grad_fn is not None:
                grad_tensors.append(obj)
    # 1b. autograd graphs that saved a target for backward also hold it (the Python tensor on a saved
    # storage may exist only because PyTorch preserves it, with nothing in Python pointing at it)
    if grad_tensors:
        from kvguardian.tensors.autograd import walk_graph

        graph_budget = deadline - max_seconds / 2  # at most half the time on graphs
        for t in grad_tensors:
            if time.monotonic() > graph_budget:
                break
            stats = walk_graph(t, max_nodes=20_000, max_seconds=max(0.05, graph_budget - time.monotonic()))
            hit = stats.storage_keys & unseeded
            for key in hit:
                candidates.setdefault(key, []).append(id(t))
                grad_edge[id(t)] = key
            if hit and id(t) not in objs:
                objs[id(t)] = t
                frontier.append(t)
    del grad_tensors

    # 2. live frames' locals (invisible to gc.get_referrers for executing frames)
    live_locals: dict[int, str] = {}
    for frame in _live_frames(skip_own=True):
        try:
            items = list(frame.f_locals.items())
        except Exception:  # pragma: no cover
            continue
        label = _frame_name(frame) + _thread_name(frame)
        for name, value in items:
            live_locals.setdefault(id(value), f"{label} local {name}")
    module_dicts: dict[int, str] = {}
    # canonical names first: "__main__" rather than its "__mp_main__" alias
    for name, m in sorted(list(sys.modules.items()), key=lambda kv: (kv[0].startswith("__mp_"), kv[0])):
        if hasattr(m, "__dict__"):
            module_dicts.setdefault(id(m.__dict__), name)
    class_dicts = _class_dicts()
    own_frame = sys._getframe()
    internal.update({id(objs), id(parent), id(frontier), id(own_frame), id(targets), id(live_locals)})

    # 3. breadth-first, backwards, until every holder tensor reaches a root
    pending = {c for ids in candidates.values() for c in ids}  # ids of holders whose chain is open
    reached: dict[int, int] = {}  # id(tensor) -> id(object directly under the root)
    depth = 0
    truncated = ""

    while frontier and pending:
        if depth >= max_depth:
            truncated = f"depth bound {max_depth} reached"
            break
        if time.monotonic() > deadline:
            truncated = f"time bound {max_seconds:g}s reached"
            break
        depth += 1
        next_frontier: list[Any] = []
        frontier_ids = {id(o) for o in frontier}
        # roots that hold frontier objects directly
        for o in frontier:
            local_label = live_locals.get(id(o))
            if local_label is not None and id(o) not in root_label:
                root_label[id(o)] = local_label
        internal.add(id(next_frontier))
        internal.add(id(frontier_ids))
        referrers = gc.get_referrers(*frontier)
        internal.add(id(referrers))
        for r in referrers:
            rid = id(r)
            if rid in internal or rid in excluded or rid in objs:
                continue
            if isinstance(r, types.FrameType) and r.f_code.co_filename.startswith(_PKG_DIR):
                continue
            if rid in module_dicts:
                for k, v in r.items():
                    if id(v) in frontier_ids and id(v) not in root_label:
                        root_label[id(v)] = f"module {module_dicts[rid]}: {k}"
                continue
            if rid in class_dicts:  # a class attribute (a cached method, a class-level registry): as global
                for k, v in r.items():
                    if id(v) in frontier_ids and id(v) not in root_label:
                        root_label[id(v)] = f"class {class_dicts[rid]}: {k}"
                continue
            children = [c for c in gc.get_referents(r) if id(c) in frontier_ids]
            if not children:
                continue
            objs[rid] = r
            for c in children:
                parent.setdefault(id(c), rid)
            if len(next_frontier) < max_frontier:
                next_frontier.append(r)
        del referrers
        # stop early when every target has a holder with an ancestor under a root
        for tid in list(pending):
            node = tid
            seen_up = {tid}
            while node not in root_label and node in parent and parent[node] not in seen_up:
                node = parent[node]
                seen_up.add(node)
            if node in root_label:
                reached[tid] = node
                pending.discard(tid)
        if all(any(c in reached for c in ids) for ids in candidates.values()):
            break
        frontier = next_frontier

    # 4. render
    chains: dict[int, HolderChain] = {}
    for key in targets:
        cands = candidates.get(key, [])
        found = min((c for c in cands if c in reached), key=lambda c: _path_len(c, parent, root_label), default=None)
        if found is None:
            found = holder_tensor.get(key) if key in holder_tensor else (cands[0] if cands else None)
        if found is None:
            chains[key] = HolderChain(
                steps=["<no Python object holds this storage>"], root="none", complete=False,
                notes=["held from C/C++ (an extension, torch.compile, a C++ autograd node) or freed meanwhile"],
            )
            continue
        tid = found
        path = [tid]
        node = tid
        seen_path = {tid}
        while node not in root_label and node in parent and parent[node] not in seen_path:
            node = parent[node]
            seen_path.add(node)
            path.append(node)
        path.reverse()  # root-most first
        steps: list[str] = []
        complete = path[0] in root_label
        root = "none"
        if complete:
            label = root_label[path[0]]
            steps.append(label)
            root = "frame" if label.startswith("frame ") else ("class" if label.startswith("class ") else "module")
        else:
            steps.append(f"<unknown holder of {type(objs[path[0]]).__name__}>")
        i = 0
        while i < len(path) - 1:
            holder, held = objs[path[i]], objs[path[i + 1]]
            nxt = objs[path[i + 2]] if i + 2 < len(path) else None
            collapsed = _collapse(holder, held, nxt) if nxt is not None else None
            if collapsed is not None:
                steps.append(collapsed)
                i += 2
                continue
            step = render_step(holder, held, redact=redact)
            if step:
                steps.append(step)
            i += 1
        tensor = objs[tid]
        if tid in grad_edge:
            steps.append(_describe_tensor(tensor) + " .grad_fn graph (saved for backward)")
            steps.append("KV storage")
            if root == "none":
                root = "autograd"
        elif isinstance(tensor, torch.Tensor):
            steps.append(_describe_tensor(tensor))
        else:
            steps.append(type(tensor).__name__)
        why = truncated or "no root reached: held from C/C++ or by an object the GC does not track"
        notes = [] if complete else [why]
        bounds = {}
        for nid in path:
            b = declared_bound(objs[nid])
            if b is not None:
                bounds[nid] = b
        chains[key] = HolderChain(steps=steps, root=root, complete=complete, depth=len(path), notes=notes,
                                  nodes=list(path), node_steps=[_node_label(objs[n]) for n in path],
                                  bounds=bounds, containers=[n for n in path if _is_collection(objs[n])])
    objs.clear()
    parent.clear()
    return chains


def _class_dicts() -> dict[int, str]:
    """id(the dict behind a class's ``__dict__``) -> ``module.Class``, for every class alive now.

    Class attributes are as global as module globals (a ``functools.lru_cache`` on a method lives in its
    class's dict), so the search treats them as roots. ``vars(cls)`` is a read-only proxy; its one referent
    is the real dict, which is what ``gc.get_referrers`` returns.
    """
    out: dict[int, str] = {}
    stack = list(object.__subclasses__())
    seen: set[int] = set()
    while stack:
        cls = stack.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        try:
            stack.extend(type.__subclasses__(cls))
            inner = gc.get_referents(vars(cls))
        except Exception:  # pragma: no cover - exotic metaclasses
            continue
        if inner and isinstance(inner[0], dict):
            name = _short(getattr(cls, "__qualname__", cls.__name__))
            out[id(inner[0])] = f"{getattr(cls, '__module__', '?')}.{name}"
    return out


_BOUND_ATTRS = ("maxsize", "maxlen", "max_size", "capacity", "max_entries")


def declared_bound(obj: Any) -> str | None:
    """A size bound declared by a container on a holder path: ``functools.lru_cache(maxsize=N)``,
    ``deque(maxlen=N)``, or an instance attribute ``maxsize``/``maxlen``/``max_size``/``capacity`` (cachetools,
    hand-written LRUs). None when unbounded or unknown."""
    import collections
    from collections.abc import MutableMapping

    try:
        if type(obj).__name__ == "_lru_cache_wrapper":
            size = obj.cache_info().maxsize
            return f"lru_cache maxsize={size}" if size is not None else None
        if isinstance(obj, collections.deque):
            return f"deque maxlen={obj.maxlen}" if obj.maxlen is not None else None
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict) and not isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            for name in _BOUND_ATTRS:
                v = d.get(name)
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    return f"{type(obj).__name__}.{name}={v}"
        if isinstance(obj, MutableMapping) and not isinstance(obj, dict):
            v = getattr(obj, "maxsize", None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return f"{type(obj).__name__}.maxsize={v}"
    except Exception:
        return None
    return None


def _is_collection(obj: Any) -> bool:
    import collections
    from collections.abc import Mapping, MutableSequence, MutableSet

    if isinstance(obj, (str, bytes)) or is_tensor_like(obj):
        return False
    return isinstance(obj, (dict, list, set, frozenset, tuple, collections.deque, Mapping, MutableSequence,
                            MutableSet)) or type(obj).__name__ == "_lru_cache_wrapper"


def is_tensor_like(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _node_label(obj: Any) -> str:
    if isinstance(obj, types.FrameType):
        return _frame_name(obj)
    if isinstance(obj, types.FunctionType):
        return f"function {_func_name(obj)}()"
    if type(obj).__name__ == "_lru_cache_wrapper":
        return f"lru_cache {_func_name(obj)}()"
    return type(obj).__name__

