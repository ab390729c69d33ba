"""Where chains start: what keeps objects alive without being an object that ``gc.get_referrers`` returns.

Module globals and class attributes, the locals of executing frames in every thread, this thread's
contextvars and running loop, trace/profile functions and signal handlers, and asyncio tasks (whose result
and callbacks CPython 3.11's GC traversal does not report). An object held by none of these is held from C,
and the chain says so. Details: docs/design/tensors.md.
"""

from __future__ import annotations

import gc
import sys
import threading
import types
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kvguardian.core.tensors.holders.access import executing_frames, frame_locals, object_array_items, thread_frames
from kvguardian.core.tensors.holders.edges import frame_function, frame_name, function_of_frame_name, short

__all__ = ["Roots", "class_namespace", "collect_roots", "functions_on_stacks", "global_label", "index_globals",
           "thread_frame_root"]

_CO_OPTIMIZED = 0x0001
_TASK_SETS = ("_all_tasks", "_scheduled_tasks", "_eager_tasks")  # asyncio.tasks, 3.11 .. 3.13


@dataclass
class Roots:
    namespaces: dict[int, str] = field(default_factory=dict)  # id(module or class dict) -> "module m" / "class C"
    held: dict[int, tuple[str, str]] = field(default_factory=dict)  # id(obj) -> (root kind, label)
    virtual: dict[int, list[Any]] = field(default_factory=dict)  # id(child) -> referrers gc cannot report
    # id(child) -> holders the garbage collector does not track at all (filled by `untracked_holders`)
    untracked: dict[int, list[Any]] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)  # strong references, only while the search runs

    def internal_ids(self) -> set[int]:
        return {id(self.namespaces), id(self.held), id(self.virtual), id(self.untracked), id(self.keep),
                *map(id, self.virtual.values()), *map(id, self.untracked.values())}

    def clear(self) -> None:
        self.keep.clear()
        self.virtual.clear()
        self.untracked.clear()
        self.held.clear()


def collect_roots(*, all_threads: bool, own_dir: str) -> Roots:
    """The roots now. ``all_threads=False`` (sampling inside a running program) reads only this thread's
    frames: reading another thread's frame locals would leave a snapshot behind."""
    roots = Roots()
    if all_threads or not _globals:
        index_globals()
    _namespaces(roots)
    _frames(roots, all_threads, own_dir)
    _contextvars(roots)
    _asyncio(roots)
    _interpreter_hooks(roots, own_dir)
    return roots


def untracked_holders(roots: Roots) -> int:
    """Find, in one pass over the heap, the holders that ``gc.get_referrers`` can never return because the
    garbage collector does not track them: numpy arrays (``tensor.numpy()`` shares the tensor's memory and
    keeps a tensor alive as its ``.base``; a view keeps its base array; an array of dtype object holds its
    items), and the dicts and tuples the collector
    stops tracking because they hold only untracked objects (``{"v": array}``). Each is recorded in
    ``roots.untracked`` under the object it holds. Returns how many edges were found."""
    np = sys.modules.get("numpy")
    if np is None:  # no numpy array can exist
        return 0
    ndarray = np.ndarray
    walk = _UntrackedWalk(roots, ndarray)
    is_tracked = gc.is_tracked
    for obj in gc.get_objects():
        for c in gc.get_referents(obj):
            t = type(c)  # the type first: most referents are strings, numbers and tracked objects
            if t is ndarray or ((t is dict or t is tuple) and not is_tracked(c)):
                walk.holds_array(c, 0)
    return walk.edges


class _UntrackedWalk:
    _MAX_DEPTH = 8  # untracked containers nested deeper than this are not followed

    def __init__(self, roots: Roots, ndarray: type) -> None:
        self.roots = roots
        self.ndarray = ndarray
        self.seen: dict[int, bool] = {}  # id -> whether an array is under it
        self.edges = 0

    def holds_array(self, obj: object, depth: int) -> bool:
        """Whether ``obj`` (untracked) is or holds a numpy array; records the edges down to each one."""
        t = type(obj)
        if t is not dict and t is not tuple and t is not self.ndarray:
            return False
        done = self.seen.get(id(obj))
        if done is not None:
            return done
        self.seen[id(obj)] = False
        found = self._array(obj) if t is self.ndarray else (
            depth < self._MAX_DEPTH and self._container(obj, depth))
        self.seen[id(obj)] = found
        return found

    def _container(self, obj: object, depth: int) -> bool:
        found = False
        for c in gc.get_referents(obj):
            if not gc.is_tracked(c) and self.holds_array(c, depth + 1):
                self._edge(obj, c)
                found = True
        return found

    def _array(self, arr: Any) -> bool:
        base = arr.base
        if base is not None:
            self._edge(arr, base)
            if type(base) is self.ndarray:
                self.holds_array(base, 0)
        items = object_array_items(arr)  # an array of objects holds them out of the collector's sight
        if items:
            self._edges(arr, [item for item in items if type(item) not in _SCALARS])
        return True

    def _edge(self, holder: object, child: object) -> None:
        self._edges(holder, [child])

    def _edges(self, holder: object, children: list[Any]) -> None:
        """``holder`` holds each of ``children``; it is kept (once) while the search runs."""
        untracked = self.roots.untracked
        for child in children:
            untracked.setdefault(id(child), []).append(holder)
        self.roots.keep.append(holder)
        self.edges += len(children)


def _namespaces(roots: Roots) -> None:
    # canonical names first: "__main__" rather than its "__mp_main__" alias
    for name, m in sorted(list(sys.modules.items()), key=lambda kv: (kv[0].startswith("__mp_"), kv[0])):
        d = getattr(m, "__dict__", None) if isinstance(m, types.ModuleType) else None
        if isinstance(d, dict):
            roots.namespaces.setdefault(id(d), f"module {name}")


_globals: dict[int, tuple[str, str]] = {}  # id(a module global's value) -> (module, name), checked when used
_SCALARS = (type(None), bool, int, float, str, bytes, types.ModuleType, type, types.BuiltinFunctionType)


def index_globals() -> None:
    """Remember which objects are module globals, so that one found by the search is known to be held by a
    root the moment it is found (one heap scan less per search). Each use checks the global still is it."""
    _globals.clear()
    _unnamed_classes.clear()
    for name, m in sorted(list(sys.modules.items()), key=lambda kv: (kv[0].startswith("__mp_"), kv[0])):
        d = getattr(m, "__dict__", None) if isinstance(m, types.ModuleType) else None
        if not isinstance(d, dict):
            continue
        for k, v in list(d.items()):
            if type(v) not in _SCALARS and isinstance(k, str):  # type(), not isinstance(): no __class__ lookups
                _globals.setdefault(id(v), (name, k))


def global_label(obj: object) -> str | None:
    """``module m: name`` when ``obj`` is (still) the module global it was indexed as."""
    hit = _globals.get(id(obj))
    if hit is None:
        return None
    d = getattr(sys.modules.get(hit[0]), "__dict__", None)
    return f"module {hit[0]}: {hit[1]}" if isinstance(d, dict) and d.get(hit[1]) is obj else None


_class_dicts: dict[int, tuple[Any, str]] = {}  # id(a class's dict) -> (weak ref to the class, "class m.C")


def class_namespace(d: dict[Any, Any]) -> str | None:
    """``class module.Class`` when ``d`` is the dict behind a class's ``__dict__``, else None.

    Class attributes are as global as module globals, so the search treats them as roots. The classes are
    walked (``type.__subclasses__``) only when a dict that looks like a class namespace (it has
    ``__module__``) is met and is not known yet; ``vars(cls)`` is a read-only proxy whose one referent is
    the real dict."""
    if "__module__" not in d:
        return None
    hit = _class_dicts.get(id(d))
    if hit is None or hit[0]() is None:
        _walk_classes()
        hit = _class_dicts.get(id(d))
    if hit is None or (cls := hit[0]()) is None or gc.get_referents(vars(cls))[:1] != [d]:
        return None
    return hit[1] if is_bound_class(cls) else None


def is_bound_class(cls: type) -> bool:
    """A class its module names (by its qualified name), or a module global anywhere: its attributes are as
    global as module globals. A class made at run time and kept in a container (``type(name, bases, ns)`` per
    plugin or request, in a registry) is not a root: what holds it is the holder."""
    obj: Any = sys.modules.get(getattr(cls, "__module__", None) or "")
    for part in getattr(cls, "__qualname__", "").split("."):
        try:
            obj = vars(obj).get(part) if obj is not None else None
        except TypeError:
            obj = None
    if obj is cls:
        return True
    hit = _unnamed_classes.get(id(cls))
    if hit is not None and hit[0]() is cls:
        return hit[1]
    bound = any(v is cls for m in list(sys.modules.values()) for v in _module_values(m))
    try:
        _unnamed_classes[id(cls)] = (weakref.ref(cls), bound)
    except TypeError:  # pragma: no cover - a metaclass without weak references: asked again next time
        pass
    return bound


# id(class its module does not name) -> (weak ref, whether a module global binds it); renewed with the globals
_unnamed_classes: dict[int, tuple[Any, bool]] = {}


def _module_values(module: object) -> list[Any]:
    try:
        return list(vars(module).values())
    except TypeError:  # pragma: no cover - a sys.modules entry that is not a module
        return []


def _walk_classes() -> None:
    _class_dicts.clear()
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
            ref = weakref.ref(cls)
        except Exception:  # pragma: no cover - exotic metaclasses, classes without weak references
            continue
        if inner and isinstance(inner[0], dict):
            qual = short(getattr(cls, "__qualname__", cls.__name__))
            _class_dicts[id(inner[0])] = (ref, f"class {getattr(cls, '__module__', '?')}.{qual}")


def _thread_names() -> dict[int, str]:
    main = threading.main_thread().ident
    names = {th.ident: th.name for th in threading.enumerate() if th.ident is not None}
    return {tid: "" if tid == main else f" [thread {name}]" for tid, name in names.items()}


def thread_frame_root(label: str) -> tuple[str, str] | None:
    """(function, thread name) of a frame root's label (`_frames`) in a thread other than the main one."""
    name, sep, rest = label.partition(" [thread ")
    if not sep or not name.startswith("frame "):
        return None
    return function_of_frame_name(name), rest.partition("]")[0]


def functions_on_stacks() -> Counter[str]:
    """`frame_function` -> how many threads (this one too) have it on their stack now."""
    out: Counter[str] = Counter()
    frames = thread_frames()
    f: Any = None
    try:
        for tid in list(frames):
            names: set[str] = set()
            f = frames.pop(tid)
            while f is not None and len(names) < 128:
                names.add(frame_function(f))
                f = f.f_back
            out.update(names)
    finally:  # hold no frame once this one returns: this thread's top frame refers back to it (a cycle,
        # which gc.DEBUG_SAVEALL would keep in gc.garbage with every caller's frame and their locals)
        f = None
        frames.clear()
    return out


def _frames(roots: Roots, all_threads: bool, own_dir: str) -> None:
    me = threading.get_ident()
    names = _thread_names()
    executing = executing_frames()
    for tid, top in thread_frames().items():
        if tid != me and not all_threads:
            continue
        f: types.FrameType | None = top
        while f is not None:
            # module-level code's locals are its module's globals: a root already, under its stable name
            if not f.f_code.co_filename.startswith(own_dir) and f.f_code.co_flags & _CO_OPTIMIZED:
                label = frame_name(f) + names.get(tid, f" [thread {tid}]")
                for name, value in frame_locals(f, may_undo=executing.get(id(f)) == me):
                    if id(value) not in roots.held:
                        roots.held[id(value)] = ("frame", f"{label} local {name}")
                        roots.keep.append(value)
            f = f.f_back


def _contextvars(roots: Roots) -> None:
    import contextvars

    name = _thread_names().get(threading.get_ident(), "")
    for var, value in contextvars.copy_context().items():
        if id(value) not in roots.held:
            roots.held[id(value)] = ("context", f"contextvar {var.name}{name}")
            roots.keep.append(value)


def _interpreter_hooks(roots: Roots, own_dir: str) -> None:
    """Callables the interpreter holds outside any object: ``sys.gettrace()`` and ``sys.getprofile()`` of this
    thread (a profiler or tracer closure keeping what it captured), and every Python signal handler (the
    signal module keeps them in a C array). The guard's own hooks are not roots."""
    hooks: list[tuple[str, Any]] = [("sys.gettrace() (this thread's trace function)", sys.gettrace()),
                                    ("sys.getprofile() (this thread's profile function)", sys.getprofile())]
    signal = sys.modules.get("signal")
    if signal is not None:
        for sig in sorted(signal.valid_signals()):
            try:
                handler = signal.getsignal(sig)
            except (ValueError, OSError):  # pragma: no cover - a signal number the platform refuses
                continue
            hooks.append((f"signal handler {_signal_name(signal, sig)}", handler))
    for label, fn in hooks:
        if fn is None or type(fn) in _SCALARS or isinstance(fn, int) or _own_code(fn, own_dir) or id(fn) in roots.held:
            continue
        roots.held[id(fn)] = ("interpreter", label)
        roots.keep.append(fn)


def _signal_name(signal: types.ModuleType, sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _own_code(fn: object, own_dir: str) -> bool:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return isinstance(code, types.CodeType) and bool(own_dir) and code.co_filename.startswith(own_dir)


def _asyncio(roots: Roots) -> None:
    aio = sys.modules.get("asyncio")
    if aio is None:
        return
    try:
        loop = aio.get_running_loop()
    except RuntimeError:  # no loop running in this thread
        loop = None
    if loop is not None and id(loop) not in roots.held:
        roots.held[id(loop)] = ("asyncio", "running event loop")
        roots.keep.append(loop)
    tasks_mod = sys.modules.get("asyncio.tasks")
    for attr in _TASK_SETS:
        tasks = getattr(tasks_mod, attr, None)
        try:
            members = list(tasks) if tasks is not None else []
        except Exception:  # pragma: no cover - changed during iteration
            members = []
        for task in members:
            roots.keep.append(task)
            for child in gc.get_referents(task):
                roots.virtual.setdefault(id(child), []).append(task)
