"""Reading objects without changing them: the auditor must not change what it measures.

In CPython 3.11+ ``obj.__dict__`` materialises a dict for inline attributes (changing the graph every later
search sees), so attributes are read with ``object.__getattribute__``; and ``frame.f_locals`` leaves a
snapshot that keeps values alive, so `frame_locals` empties it again. Details: docs/design/tensors.md.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = ["attr_name", "executing_frames", "existing_dict", "frame_locals", "instance_attrs", "is_a",
           "object_array_items", "pure_python_class", "safe_attr", "safe_len", "safe_members", "thread_frames"]

_MANAGED_DICT = 1 << 4  # Py_TPFLAGS_MANAGED_DICT (3.11+): the instance dict may not exist yet
_CO_OPTIMIZED = 0x0001
_MISSING = object()
_names_cache: dict[int, tuple[Any, frozenset[str]]] = {}  # id(type) -> (type, names); cleared per search


_T = TypeVar("_T")
_T2 = TypeVar("_T2")
_T3 = TypeVar("_T3")


@overload
def is_a(obj: object, kinds: type[_T]) -> TypeIs[_T]: ...
@overload
def is_a(obj: object, kinds: tuple[type[_T], type[_T2]]) -> TypeIs[_T | _T2]: ...
@overload
def is_a(obj: object, kinds: tuple[type[_T], type[_T2], type[_T3]]) -> TypeIs[_T | _T2 | _T3]: ...
@overload
def is_a(obj: object, kinds: tuple[type, ...]) -> bool: ...
def is_a(obj: object, kinds: type | tuple[type, ...]) -> bool:
    """``isinstance`` by the object's real type: never reads ``obj.__class__`` (a property on proxies and
    lazy objects runs user code, and some warn)."""
    return issubclass(type(obj), kinds)


def clear_caches() -> None:
    _names_cache.clear()


def _type_attr(tp: type, name: str) -> Any:
    for cls in tp.__mro__:
        try:
            d = cls.__dict__
        except Exception:  # pragma: no cover
            continue
        if name in d:
            return d[name]
    return _MISSING


def _is_data_descriptor(attr: object) -> bool:
    t = type(attr)
    return hasattr(t, "__set__") or hasattr(t, "__delete__")


def _runs_code(attr: object) -> bool:
    """Reading an attribute the type defines as ``attr`` may run code: a property, ``cached_property``, any
    descriptor but a slot."""
    return attr is not _MISSING and hasattr(type(attr), "__get__") and type(attr) is not types.MemberDescriptorType


def safe_attr(obj: object, name: str, default: Any = None) -> Any:
    """``obj.name`` when it is a plain instance attribute or slot, else ``default``: no property, no
    ``__getattr__``, no descriptor code runs, and no instance dict is materialised."""
    tp = type(obj)
    attr = _type_attr(tp, name)
    if _runs_code(attr):
        return default
    try:
        value = object.__getattribute__(obj, name)
    except Exception:
        return default
    if attr is not _MISSING and value is attr:  # a class attribute, not the instance's
        return default
    return value


def safe_len(obj: object) -> int | None:
    """``len(obj)`` for builtin containers and their subclasses (their C length, never a user ``__len__``);
    None for anything else."""
    import collections

    for base in (dict, list, set, frozenset, tuple, collections.deque):
        if is_a(obj, base):
            length: Any = base.__len__
            return int(length(obj))
    return None


_MAX_ARRAY_ITEMS = 1_000_000


def object_array_items(obj: Any) -> list[Any] | None:
    """The objects a numpy array of dtype object holds (numpy does not show them to the garbage collector:
    ``gc.get_referents`` of the array is empty), read in memory order; None for any other object or a larger
    array than is worth reading."""
    np = sys.modules.get("numpy")
    if np is None or type(obj) is not np.ndarray or not obj.dtype.hasobject or obj.size > _MAX_ARRAY_ITEMS:
        return None
    return list(obj.flat)


def safe_members(obj: object) -> list[Any]:
    """The members (a dict's values) of a builtin container or subclass, read with the builtin's own
    iteration, never a user ``__iter__``; [] for anything else."""
    import collections

    if is_a(obj, dict):
        return list(dict.values(obj))
    for base in (list, tuple, set, frozenset, collections.deque):
        if is_a(obj, base):
            it: Any = base.__iter__
            return list(it(obj))
    return []


def _code_names(code: types.CodeType, out: set[str], depth: int = 0) -> None:
    out.update(code.co_names)
    if depth < 4:
        for c in code.co_consts:
            if is_a(c, types.CodeType):
                _code_names(c, out, depth + 1)


def _function_codes(value: object) -> Iterator[types.CodeType]:
    for v in (value, getattr(value, "__func__", None), getattr(value, "fget", None), getattr(value, "fset", None)):
        code = getattr(v, "__code__", None) if is_a(v, types.FunctionType) else None
        if isinstance(code, types.CodeType):
            yield code


def _candidate_names(tp: type) -> frozenset[str]:
    """Attribute names the class's own code (its methods, and the functions of its module and of
    ``__main__``) reads or writes: where inline instance attributes get their names."""
    hit = _names_cache.get(id(tp))
    if hit is not None and hit[0] is tp:
        return hit[1]
    names: set[str] = set()
    namespaces: list[Any] = [vars(c) for c in tp.__mro__ if c is not object]
    for modname in (getattr(tp, "__module__", None), "__main__"):
        mod = sys.modules.get(modname) if isinstance(modname, str) else None
        if mod is not None:
            namespaces.append(mod.__dict__)
    for ns in namespaces:
        for value in list(ns.values()):
            for code in _function_codes(value):
                _code_names(code, names)
            if is_a(value, type) and value.__module__ == getattr(tp, "__module__", None):
                for inner in list(vars(value).values()):
                    for code in _function_codes(inner):
                        _code_names(code, names)
    result = frozenset(names)
    _names_cache[id(tp)] = (tp, result)
    return result


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a type made by a class statement, not written in C


def pure_python_class(tp: type) -> bool:
    """Whether every class of ``tp``'s MRO but ``object`` was made by a class statement: what its instances
    refer to is their attributes, slots and class (no C fields of a builtin base)."""
    return all(c.__flags__ & _HEAPTYPE for c in tp.__mro__[:-1])


def existing_dict(obj: object) -> dict[str, Any] | None:
    """The instance dict of ``obj`` if it exists already (never creating it)."""
    tp = type(obj)
    if not tp.__flags__ & _MANAGED_DICT:
        if is_a(obj, (types.FunctionType, types.ModuleType, type)):
            d = obj.__dict__
            return d if is_a(d, dict) else None
        try:
            d = object.__getattribute__(obj, "__dict__")
        except Exception:
            return None
        return d if is_a(d, dict) else None
    for d in gc.get_referents(obj):  # a dict subclass too: ``obj.__dict__ = MyDict()``
        if is_a(d, dict) and dict.__len__(d) and _is_own_dict(obj, d):
            return d
    return None


def _is_own_dict(obj: object, d: dict[Any, Any]) -> bool:
    tp = type(obj)
    checked = 0
    for k, v in list(dict.items(d)):
        if not is_a(k, str):
            return False
        if _runs_code(_type_attr(tp, k)):
            continue
        try:
            if object.__getattribute__(obj, k) is not v:
                return False
        except Exception:
            return False
        checked += 1
        if checked >= 4:
            break
    return checked > 0


def _probe_names(tp: type) -> tuple[str, ...]:
    """Candidate names that a plain instance attribute could have (not data descriptors of the type)."""
    key = -id(tp)
    hit = _names_cache.get(key)
    if hit is not None and hit[0] is tp:
        return tuple(hit[1])
    names = tuple(sorted(n for n in _candidate_names(tp) if not _runs_code(_type_attr(tp, n))))
    _names_cache[key] = (tp, frozenset(names))
    return names


def instance_attrs(obj: object) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of ``obj``'s instance attributes and slots, read without side effects (a name
    that is only a method of the class may come with a bound method: compare values by identity)."""
    tp = type(obj)
    for cls in tp.__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            try:
                yield slot, object.__getattribute__(obj, slot)
            except Exception:
                continue
    if is_a(obj, (type, types.ModuleType)):
        return
    d = existing_dict(obj)
    if d is not None:
        yield from list(d.items())
        return
    if not tp.__flags__ & _MANAGED_DICT:
        return
    for name in _probe_names(tp):
        try:
            yield name, object.__getattribute__(obj, name)
        except Exception:
            continue


def attr_name(obj: object, child: object) -> str | None:
    """The name of ``obj``'s attribute (or slot) that holds ``child``."""
    for name, value in instance_attrs(obj):
        if value is child:
            return name
    return None


def frame_locals(frame: types.FrameType, *, may_undo: bool) -> list[tuple[str, Any]]:
    """A frame's local variables, read without leaving a snapshot behind.

    ``f_locals`` of a function frame is a snapshot dict stored on the frame; with ``may_undo`` (a suspended
    generator's or coroutine's frame, a finished frame, or one executing in this thread - never another
    thread's, whose tracer may be between its own ``f_locals`` read and write-back) it is emptied again when
    only the frame holds it (the next ``f_locals``/``locals()`` refills it). Module and class frames'
    ``f_locals`` are their real namespaces: read as they are."""
    try:
        d = frame.f_locals
        items = list(d.items())
    except Exception:  # pragma: no cover
        return []
    # references to the snapshot: the frame's slot, `d`, getrefcount's argument
    if may_undo and frame.f_code.co_flags & _CO_OPTIMIZED and sys.getrefcount(d) <= 3:
        d.clear()
    del d
    return [(str(k), v) for k, v in items]


def thread_frames() -> dict[int, types.FrameType]:
    """Thread id -> its top frame, for every thread (CPython's one API for other threads' frames)."""
    return sys._current_frames()  # noqa: SLF001, RUF100 - no public equivalent


def executing_frames() -> dict[int, int]:
    """id(frame) -> thread id, for every frame executing now in any thread."""
    out: dict[int, int] = {}
    for tid, top in thread_frames().items():
        f: types.FrameType | None = top
        while f is not None and id(f) not in out:
            out[id(f)] = tid
            f = f.f_back
    return out
