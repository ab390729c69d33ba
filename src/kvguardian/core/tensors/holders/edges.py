"""Naming one reference: ``list[3]``, ``Engine.cache``, ``frame f() local kv``, ``contextvar request_kv``.

Every name is read without side effects (`access`): no instance dict is materialised, no property or
``__getattr__`` runs. Dictionary keys are shown only when they look like identifiers (never free text such
as a prompt), and not at all with ``redact``.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import sys
import threading
import types
import weakref
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import contextvars

    from typing_extensions import TypeIs

from kvguardian.core.tensors.holders.access import (
    attr_name,
    executing_frames,
    existing_dict,
    frame_locals,
    is_a,
    object_array_items,
    pure_python_class,
)

__all__ = ["collapse", "edge_key", "frame_function", "frame_name", "func_name", "function_of_frame_name", "is_future",
           "key_repr", "node_label", "render_step", "short"]

_SAFE_KEY = re.compile(r"^[\w.:\-/@#]{1,48}$")


def key_repr(key: object, redact: bool) -> str:
    """A dictionary key as a chain shows it (a tuple of more than 3 ints, token ids, by its length only). Keys
    of user subclasses (an ``IntEnum``, a ``str`` subclass, a
    named tuple) are read with the builtin type's own methods: no user ``__repr__``/``__len__`` runs."""
    if is_a(key, str):
        if not redact and _SAFE_KEY.match(key):
            return str.__repr__(str.__str__(key))
        return f"<str len={str.__len__(key)}>"
    if is_a(key, (int, float)) or key is None:  # bool is an int
        if redact:
            return "<key>"
        base: Any = bool if is_a(key, bool) else (int if is_a(key, int) else float)
        return "None" if key is None else base.__repr__(key)
    if is_a(key, tuple):
        n = tuple.__len__(key)
        if n > 3 and all(is_a(k, int) for k in tuple.__getitem__(key, slice(0, 64))):
            return f"<tuple of {n} ints>"  # token ids: the prompt in another form, never shown
        items = tuple.__getitem__(key, slice(0, 4))
        more = tuple.__len__(key) > 4
        inner = ", ".join(key_repr(k, redact) for k in items) + (", …" if more else "")
        return f"({inner},)" if tuple.__len__(key) == 1 else f"({inner})"
    if is_a(key, type) and not redact:  # a registry keyed by class (singledispatch, a metaclass's instances)
        name = getattr(key, "__qualname__", "")
        return f"<class {short(name)}>" if is_a(name, str) and _SAFE_KEY.match(short(name)) else "<class>"
    return f"<{type(key).__name__}>"


def short(qualname: str) -> str:
    """``outer.<locals>.Engine.encode`` -> ``Engine.encode``: the part a reader recognises."""
    return qualname.rsplit(".<locals>.", 1)[-1]


def func_name(fn: object) -> str:
    name = getattr(fn, "__qualname__", None) if is_a(fn, (types.FunctionType, type)) else None
    if name is None and type(fn).__name__ == "_lru_cache_wrapper":
        name = getattr(getattr(fn, "__wrapped__", None), "__qualname__", None)
    return short(str(name or type(fn).__name__))


def frame_name(frame: types.FrameType) -> str:
    code = frame.f_code
    return f"frame {code.co_name}() ({os.path.basename(code.co_filename)}:{frame.f_lineno})"


def frame_function(frame: types.FrameType) -> str:
    """``run() (threading.py)``: `frame_name` without the line (where a waiting thread is may move)."""
    code = frame.f_code
    return f"{code.co_name}() ({os.path.basename(code.co_filename)})"


def function_of_frame_name(name: str) -> str:
    """`frame_function` read back from a `frame_name`: ``frame run() (threading.py:1399)`` -> ``run()
    (threading.py)``."""
    func, _, where = name.removeprefix("frame ").partition(" (")
    return f"{func} ({where.rpartition(':')[0] or where.rstrip(')')})"


def _local_name(frame: types.FrameType, child: object) -> str | None:
    # a frame another thread is executing is read as it is (its tracer may be between read and write-back)
    mine = executing_frames().get(id(frame), threading.get_ident()) == threading.get_ident()
    for name, v in frame_locals(frame, may_undo=mine):
        if v is child:
            return name
    return None


def _is_context(obj: object) -> TypeIs[contextvars.Context]:
    import contextvars

    return type(obj) is contextvars.Context


def _mapping_step(parent: dict[Any, Any], child: object, redact: bool) -> str:
    kind = "dict" if type(parent) is dict else type(parent).__name__
    for k, v in list(dict.items(parent)):
        if v is child:
            return f"{kind}[{key_repr(k, redact)}]"
    for k in list(dict.keys(parent)):
        if k is child:
            return f"{kind} key"
    return kind


def _sequence_step(parent: list[Any] | tuple[Any, ...], child: object) -> str:
    kind = type(parent).__name__
    items = list.__iter__(parent) if is_a(parent, list) else tuple.__iter__(parent)
    for i, v in enumerate(list(items)):
        if v is child:
            if is_a(child, types.TracebackType):
                return f"{kind}[{i}] (traceback)"
            return f"{kind}[{i}]"
    return kind


def _callable_step(parent: object, child: object) -> str | None:
    if is_a(parent, functools.partial):
        if child is parent.func:
            return "partial.func"
        return "partial.keywords" if child is parent.keywords else "partial"
    if is_a(parent, types.FunctionType):
        for i, cell in enumerate(parent.__closure__ or ()):
            if cell is child:
                return f"function {func_name(parent)}() closure var {parent.__code__.co_freevars[i]}"
        if child is parent.__defaults__:
            return f"function {func_name(parent)}() defaults"
        return f"function {func_name(parent)}()"
    if is_a(parent, types.MethodType):
        return f"bound method {func_name(parent.__func__)}()" + (" self" if child is parent.__self__ else "")
    # ``sink.append`` kept as a callback, a task's ``task_wakeup``: it holds its object
    owner = _builtin_self(parent)
    if owner is not None and is_a(parent, types.BuiltinMethodType):
        return f"bound method {type(owner).__name__}.{parent.__name__}()" + (" self" if child is owner else "")
    if type(parent).__name__ == "_lru_cache_wrapper":
        return f"lru_cache {func_name(parent)}()"
    if is_a(parent, (staticmethod, classmethod)) and child is parent.__func__:
        return f"{type(parent).__name__}.__func__"
    if is_a(parent, property):
        part = next((a for a in ("fget", "fset", "fdel") if getattr(parent, a) is child), None)
        return f"property.{part}" if part is not None else "property"
    if is_a(parent, weakref.ref) and child is parent.__callback__:
        return "weakref callback"  # weakref.ref(obj, callback): kept as long as the weak reference is
    return None


def _builtin_self(fn: object) -> object:
    """The object a C method is bound to (``[].append.__self__``), None for a plain builtin function or
    anything else."""
    if not is_a(fn, types.BuiltinMethodType):
        return None
    owner = getattr(fn, "__self__", None)
    return None if owner is None or is_a(owner, types.ModuleType) else owner


def _frame_step(parent: object, child: object) -> str | None:
    if is_a(parent, types.FrameType):
        local = _local_name(parent, child)
        if local is not None:
            return f"{frame_name(parent)} local {local}"
        return f"{frame_name(parent)} (caller)" if child is parent.f_back else frame_name(parent)
    if is_a(parent, types.TracebackType):
        return "traceback" if child is parent.tb_frame else "traceback (next)"
    if is_a(parent, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
        kind = {types.GeneratorType: "generator", types.CoroutineType: "coroutine"}.get(type(parent), "async generator")
        frame = next((f for a in ("gi_frame", "cr_frame", "ag_frame") if (f := getattr(parent, a, None))), None)
        local = _local_name(frame, child) if frame is not None else None
        name = short(parent.__qualname__)
        return f"{kind} {name}() local {local}" if local is not None else f"{kind} {name}()"
    return None


# what a torch tensor holds in C fields, read through TensorBase's own getters (no Python code, no warning)
_TENSOR_FIELDS = ("_backward_hooks", "_post_accumulate_grad_hooks", "_base")


def _tensor_step(parent: object, child: object) -> str | None:
    torch = sys.modules.get("torch")
    if torch is None or not issubclass(type(parent), torch.Tensor):
        return None
    base = torch._C.TensorBase  # noqa: SLF001, RUF100 - the C type whose getters read the fields
    for name in _TENSOR_FIELDS:
        getter = base.__dict__.get(name)
        try:
            if getter is not None and getter.__get__(parent, base) is child:
                return f"{type(parent).__name__}.{name}"
        except Exception:  # pragma: no cover - a tensor subclass whose field cannot be read
            continue
    return None


def _special_step(parent: object, child: object) -> str | None:
    tensor = _tensor_step(parent, child)
    if tensor is not None:
        return tensor
    if type(parent).__module__ == "numpy" and getattr(parent, "base", None) is child:
        return "ndarray.base"  # a numpy array on the tensor's memory (``tensor.numpy()``, or a view of one)
    if type(parent).__name__ == "_local" and type(parent).__module__ == "_thread":
        return "threading.local (this thread's attributes)"
    if is_a(parent, types.CellType):
        return ""  # named by the step before: "function f() closure cell x", or a frame's cell variable
    if _is_context(parent):
        for var, value in list(parent.items()):
            if value is child:
                return f"contextvar {var.name}"
        return "contextvars.Context"
    if is_future(parent):
        return f"{type(parent).__name__}.{_future_part(parent, child)}"
    if is_a(parent, BaseException):
        for attr in ("__traceback__", "__context__", "__cause__"):
            if getattr(parent, attr, None) is child:
                return f"{type(parent).__name__}.{attr}"
        if child is parent.args:
            return f"{type(parent).__name__}.args"
    if is_a(parent, type):
        return f"class {short(parent.__qualname__)}"
    if is_a(parent, types.ModuleType):
        return f"module object {parent.__name__}"
    return None


_CALLABLES = (types.FunctionType, types.MethodType, types.BuiltinMethodType, functools.partial)


class _Future(Protocol):
    """What is read of an asyncio Future or Task here."""

    def done(self) -> bool: ...


def _done(future: _Future) -> bool:
    try:
        return bool(future.done())
    except Exception:  # pragma: no cover - a future whose done() fails: assume it may hold a result
        return True


def is_future(obj: object) -> TypeIs[_Future]:
    """An asyncio Future or Task (C or Python): what it holds is read with ``gc.get_referents``, never with
    ``result()``/``exception()``, which would mark an exception as retrieved."""
    return type(obj).__module__ in ("_asyncio", "asyncio.futures", "asyncio.tasks") and hasattr(type(obj), "done")


def _future_part(future: _Future, child: object) -> str:
    if not _done(future) and is_a(child, _CALLABLES):  # a pending future holds no result: its done-callbacks
        return "add_done_callback() callback"
    if is_a(child, BaseException):
        return "exception()"
    if is_a(child, (types.CoroutineType, types.GeneratorType)):
        return "get_coro()"
    if _is_context(child):
        return "context"
    if is_a(child, (list, str)) or type(child).__name__.endswith("EventLoop"):
        return type(child).__name__
    return "result()"


def render_step(parent: object, child: object, *, redact: bool = False) -> str:
    """Name the edge ``parent → child`` readably: ``list[3]``, ``Engine.cache``, ``frame f() local kv``."""
    if is_a(parent, dict):
        return _mapping_step(parent, child, redact)
    if is_a(parent, collections.deque):
        for i, v in enumerate(list(collections.deque.__iter__(parent))):
            if v is child:
                return f"deque[{i}]"
        return "deque"
    for step in (_special_step, _callable_step, _frame_step):
        out = step(parent, child)
        if out is not None:
            return out
    if is_a(parent, (list, tuple)):
        return _sequence_step(parent, child)
    items = object_array_items(parent)
    if items is not None:
        at = next((i for i, v in enumerate(items) if v is child), None)
        return f"ndarray[{at}] (flat)" if at is not None else "ndarray"
    name = attr_name(parent, child)
    if name is not None:
        return f"{type(parent).__name__}.{name}"
    if child is type(parent):  # an instance holds its class (a class made at run time, its attributes shared)
        return f"{type(parent).__name__}.__class__"
    if pure_python_class(type(parent)) and existing_dict(parent) is None:
        return f"{type(parent).__name__}.<attribute set by a computed name>"  # setattr(obj, f"req_{i}", ...)
    if type(child) is not dict and is_a(child, dict) and _own_attrs(parent, child):
        return f"{type(parent).__name__}.__dict__ ({type(child).__name__})"  # ``obj.__dict__ = MyDict()``
    return type(parent).__name__


def collapse(a: object, b: object, c: object) -> str | None:
    """Name a two-hop step ``a → b → c`` as one when ``b`` is an implementation detail of ``a``:
    an instance's or class's ``__dict__``, a function's closure tuple, an lru_cache's cache dict."""
    if is_a(b, dict):
        out = _dict_collapse(a, b, c)
        if out is not None:
            return out
    if is_a(a, functools.partial) and b is a.args:
        for i, v in enumerate(b):
            if v is c:
                return f"partial.args[{i}]"
    if type(a).__name__ == "_local" and is_a(b, dict) and is_a(c, dict):
        return "threading.local (one thread's attributes)"
    if is_a(a, types.FunctionType) and b is a.__closure__ and is_a(c, types.CellType):
        for i, cell in enumerate(a.__closure__ or ()):
            if cell is c:
                return f"function {func_name(a)}() closure cell {a.__code__.co_freevars[i]}"
    return None


def _dict_collapse(a: object, b: dict[Any, Any], c: object) -> str | None:
    if type(a).__name__ == "_lru_cache_wrapper":
        return f"lru_cache {func_name(a)}() cached " + ("result" if any(v is c for v in b.values()) else "key")
    if is_a(a, type):
        for k, v in list(vars(a).items()):
            if v is c:
                return f"class {short(a.__qualname__)}.{k}"
        return None
    if is_a(a, types.ModuleType) and a.__dict__ is b:  # a module object no ``sys.modules`` entry names
        for k, v in list(b.items()):
            if v is c and is_a(k, str):
                return f"module object {a.__name__}: {k}"
        return None
    if is_a(a, types.FunctionType) and a.__dict__ is b:  # an attribute set on a function (``fn.seen = []``)
        for k, v in list(b.items()):
            if v is c and is_a(k, str):
                return f"function {func_name(a)}().{k}"
        return None
    # an instance's attribute; a dict subclass has its own attributes besides its items
    if not is_a(a, types.ModuleType) and type(a) is not dict and _own_attrs(a, b):
        for k, v in list(dict.items(b)):
            if v is c and is_a(k, str):
                return f"{type(a).__name__}.{k}"
    return None


def _own_attrs(a: object, b: object) -> bool:
    """Whether ``b`` is the instance dict of ``a`` (not one of ``a``'s items when ``a`` is a mapping)."""
    return existing_dict(a) is b and not (is_a(a, dict) and any(v is b for v in dict.values(a)))


def edge_key(parent: object, child: object) -> str:
    """A coarse kind of the edge, for recognising repeated shapes: ``attr:NAME`` for an instance attribute,
    ``item`` for a container member, else the parent's type."""
    if is_a(parent, (dict, list, tuple, set, frozenset, collections.deque)):
        return "item"
    if is_a(parent, (types.FunctionType, types.FrameType, types.CellType, type, types.ModuleType)):
        return type(parent).__name__
    name = attr_name(parent, child)
    return f"attr:{name}" if name is not None else type(parent).__name__


def node_label(obj: object) -> str:
    if is_a(obj, types.FrameType):
        return frame_name(obj)
    if is_a(obj, types.FunctionType):
        return f"function {func_name(obj)}()"
    if type(obj).__name__ == "_lru_cache_wrapper":
        return f"lru_cache {func_name(obj)}()"
    if is_a(obj, types.MethodType):
        return f"bound method {func_name(obj.__func__)}()"
    owner = _builtin_self(obj)
    if owner is not None and is_a(obj, types.BuiltinMethodType):
        return f"bound method {type(owner).__name__}.{obj.__name__}()"
    return type(obj).__name__
