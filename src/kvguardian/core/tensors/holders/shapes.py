"""Collections recognised by what they are and by their shape.

A container type (dict, list, set, deque, ``functools.lru_cache``, a ``Mapping``...) is a collection. So is a
*linked structure*: a run of same-type objects reached through the same attribute (``Turn.parent →
Turn.parent → ...``, a linked list's ``next``) or through the same attribute and a container
(``Node.children → list → Node``, a tree). Its head - the run's first object - stands for the structure: each
member that holds an ended request's KV is one more entry in it, exactly like an entry in a list.
"""

from __future__ import annotations

import collections
import gc
import sys
import types
import weakref
from collections.abc import Mapping, MutableSequence, MutableSet
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    import torch

from kvguardian.core.tensors.holders.access import (
    attr_name,
    existing_dict,
    is_a,
    object_array_items,
    pure_python_class,
    safe_attr,
    safe_members,
)

__all__ = ["declared_bound", "dynamic_attrs_size", "is_collection", "is_tensor_like", "linked_runs", "linked_size",
           "opaque_size"]

_BOUND_ATTRS = ("maxsize", "maxlen", "max_size", "capacity", "max_entries", "_Cache__maxsize")
_MAX_WALK = 100_000


def is_tensor_like(obj: object) -> TypeGuard[torch.Tensor]:
    torch = sys.modules.get("torch")
    return torch is not None and issubclass(type(obj), torch.Tensor)


def is_collection(obj: object) -> bool:
    if is_a(obj, (str, bytes)) or is_tensor_like(obj):
        return False
    return is_a(obj, (dict, list, set, frozenset, tuple, collections.deque, Mapping, MutableSequence,
                            MutableSet)) or type(obj).__name__ == "_lru_cache_wrapper"


# C objects whose references are named (a frame's locals, a closure's cells, a method's self...): never a collection
_NAMED = (types.FrameType, types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType, types.CellType,
          types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType, type,
          types.MappingProxyType, types.CodeType, types.TracebackType, property, staticmethod, classmethod,
          weakref.ref)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: the type was made by a class statement, not written in C


def opaque_size(obj: object, member: object) -> int | None:
    """How many objects of ``member``'s type a C object holds without naming them (``itertools.tee``'s
    buffer, a numpy array of objects, a C extension's table): two or more make it a collection, like a list of
    them. None otherwise."""
    tp = type(obj)
    if tp.__flags__ & _HEAPTYPE or is_a(obj, _NAMED) or is_collection(obj) or is_tensor_like(obj):
        return None
    try:
        items = object_array_items(obj)
        n = sum(1 for r in (gc.get_referents(obj) if items is None else items) if type(r) is type(member))
    except Exception:  # pragma: no cover - a C type whose traversal fails
        return None
    return n if n >= 2 else None


def dynamic_attrs_size(obj: object, member: object) -> int | None:
    """How many objects of ``member``'s type an instance holds in attributes its class's code never names
    (``setattr(state, f"req_{i}", out)``, one attribute per request), when ``member`` is one of them: two or
    more make the instance a collection, as its ``__dict__`` is once CPython stops keeping the attributes
    inline. None otherwise (an attribute the code names, ``self.cache``, is a single reference)."""
    tp = type(obj)
    if not pure_python_class(tp) or existing_dict(obj) is not None:
        return None
    if attr_name(obj, member) is not None:
        return None
    try:
        n = sum(1 for r in gc.get_referents(obj) if type(r) is type(member) and r is not tp)
    except Exception:  # pragma: no cover - a type whose traversal fails
        return None
    return n if n >= 2 else None


def declared_bound(obj: Any) -> str | None:
    """A size bound declared by a container on a holder path: ``functools.lru_cache(maxsize=N)``,
    ``deque(maxlen=N)``, or an attribute ``maxsize``/``maxlen``/``max_size``/``capacity`` (cachetools, hand-written
    LRUs). None when unbounded or unknown. Read without running the object's code."""
    try:
        if type(obj).__name__ == "_lru_cache_wrapper":
            size = obj.cache_info().maxsize
            return f"lru_cache maxsize={size}" if size is not None else None
        if is_a(obj, collections.deque):
            return f"deque maxlen={obj.maxlen}" if obj.maxlen is not None else None
        if is_a(obj, (type, types.ModuleType, types.FunctionType, dict, list, set, tuple)):
            return None
        for name in _BOUND_ATTRS:
            v = safe_attr(obj, name)
            if v is None:
                v = _class_constant(obj, name)
            if is_a(v, int) and not is_a(v, bool) and v > 0:
                return f"{type(obj).__name__}.{name.replace('_Cache__', '')}={v}"
    except Exception:
        return None
    return None


def _class_constant(obj: object, name: str) -> Any:
    for cls in type(obj).__mro__:
        v = cls.__dict__.get(name)
        if v is not None:
            return v if is_a(v, int) else None
    return None


def linked_runs(types_: list[type], edges: list[str]) -> dict[int, str]:
    """Heads of linked runs on one path: index of the head -> how it links (``Turn.parent``, ``Node.children[]``).

    ``types_[i]`` is the type of node i, ``edges[i]`` the kind of the reference from node i to node i+1
    (`edges.edge_key`). A run is node i of type T reaching another T through the same attribute, directly
    (period 1) or through one container (period 2); the head is the first node of a maximal run."""
    heads: dict[int, str] = {}
    n = len(types_)
    i = 0
    while i < n - 1:
        end, how = _run_from(types_, edges, i)
        if end > i:
            heads[i] = how
            i = end
        else:
            i += 1
    return heads


def _run_from(types_: list[type], edges: list[str], i: int) -> tuple[int, str]:
    t = types_[i]
    if _plain(t) and edges[i].startswith("attr:"):
        attr = edges[i][5:]
        j = i
        while j + 1 < len(types_) and types_[j + 1] is t and edges[j] == edges[i]:
            j += 1
        if j > i:
            return j, f"{t.__name__}.{attr}"
        if i + 2 < len(types_) and types_[i + 2] is t and edges[i + 1] == "item":
            j = i
            while j + 2 < len(types_) and types_[j + 2] is t and edges[j] == edges[i] and edges[j + 1] == "item":
                j += 2
            return j, f"{t.__name__}.{attr}[]"
    return i, ""


def _plain(t: type) -> bool:
    """An ordinary class instance (not a container, function, frame, tensor, ...)."""
    if t.__module__ == "builtins" or issubclass(t, (dict, list, tuple, set, collections.deque)):
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and issubclass(t, torch.Tensor))


def linked_size(head: object, how: str) -> int:
    """How many objects the linked structure starting at ``head`` has (bounded walk)."""
    tp = type(head)
    attr = how.split(".", 1)[1]
    through_items = attr.endswith("[]")
    attr = attr.rstrip("[]")
    seen = {id(head)}
    stack = [head]
    while stack and len(seen) < _MAX_WALK:
        v = safe_attr(stack.pop(), attr)
        nxt = _members(v, tp) if through_items else ([v] if type(v) is tp else [])
        for m in nxt:
            if id(m) not in seen:
                seen.add(id(m))
                stack.append(m)
    return len(seen)


def _members(container: object, tp: type) -> list[Any]:
    return [m for m in safe_members(container) if type(m) is tp]
