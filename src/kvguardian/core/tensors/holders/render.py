"""From a path of objects to a `HolderChain`: readable steps, and what `retention` needs to judge it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvguardian.core.tensors.holders.access import safe_len
from kvguardian.core.tensors.holders.chain import HolderChain
from kvguardian.core.tensors.holders.edges import collapse, edge_key, is_future, node_label, render_step
from kvguardian.core.tensors.holders.shapes import (
    declared_bound,
    dynamic_attrs_size,
    is_collection,
    linked_runs,
    linked_size,
    opaque_size,
)

__all__ = ["PathView", "render_chain", "top_label"]

_C_NOTE = ("no Python object refers to it: held from C (the atexit registry, a C extension, the interpreter) "
           "or by an object the garbage collector does not track")


@dataclass
class PathView:
    """One path to render: object ids top first, the objects, and how the top is held."""

    path: list[int]
    objs: dict[int, Any]
    root: tuple[str, str] | None  # (kind, label) when the top is held by a root
    stopped: str = ""  # the search's stop reason, when the budget cut it
    redact: bool = False
    grad_edge: bool = False  # the last object holds the storage through its autograd graph
    tail: str = ""  # the last step (the tensor's description)
    light: bool = False  # nodes, collections and bounds only: no step names (sampling)


def top_label(obj: object) -> tuple[str, str] | None:
    """Objects that nothing in Python refers to, yet are real roots: a thread's current context, an
    asyncio task on its loop. None for anything else (then it is held from C)."""
    import contextvars

    if type(obj) is contextvars.Context:
        return "context", "contextvars.Context (a thread's current context, held by its thread state)"
    if is_future(obj):
        name = obj.get_name() if hasattr(obj, "get_name") else type(obj).__name__
        state = "done" if obj.done() else "pending"
        return "asyncio", f"asyncio {type(obj).__name__} {name!r} ({state}, held by its event loop)"
    return None


def render_chain(view: PathView) -> HolderChain:
    objs = [view.objs[n] for n in view.path]
    root = view.root or top_label(objs[0])
    complete = root is not None
    steps: list[str] = [root[1]] if root is not None else [_lead(view, objs[0])]
    if not view.light:
        steps += _steps(objs, view.redact)
    kind = root[0] if root is not None else ("none" if view.stopped else "c")
    if view.grad_edge:
        steps += [f"{view.tail} .grad_fn graph (saved for backward)", "KV storage"]
        if not complete:
            kind = "autograd"
    elif view.tail:
        steps.append(view.tail)
    notes = [] if complete else [view.stopped or _c_note()]
    chain = HolderChain(steps=steps, root=kind, complete=complete, depth=len(view.path), notes=notes,
                        nodes=list(view.path), node_steps=[node_label(o) for o in objs],
                        stopped=bool(view.stopped) and not complete)
    _collections(chain, objs)
    return chain


def _c_note() -> str:
    import gc

    frozen = gc.get_freeze_count()
    if frozen:
        return (f"{_C_NOTE}; gc.freeze() hides {frozen} objects from the search: gc.unfreeze() before the check "
                "(kv-guardian run does at exit)")
    return _C_NOTE


def _lead(view: PathView, top: object) -> str:
    if view.stopped:
        return f"<{view.stopped}; nearest Python object: {node_label(top)}>"
    return f"held from outside Python (C), nearest Python object: {node_label(top)}"


def _context_hop(objs: list[Any], i: int) -> tuple[str, int] | None:
    """``Context → hamt → hamt node → value`` as one step, ``contextvar NAME``."""
    import contextvars

    if type(objs[i]) is not contextvars.Context:
        return None
    j = i + 1
    while j < len(objs) - 1 and type(objs[j]).__name__.startswith("hamt"):
        j += 1
    name = next((var.name for var, value in list(objs[i].items()) if value is objs[j]), None)
    return (f"contextvar {name}", j) if name is not None else None


def _steps(objs: list[Any], redact: bool) -> list[str]:
    steps: list[str] = []
    i = 0
    while i < len(objs) - 1:
        hop = _context_hop(objs, i)
        if hop is not None:
            steps.append(hop[0])
            i = hop[1]
            continue
        nxt = objs[i + 2] if i + 2 < len(objs) else None
        collapsed = _safely(collapse, objs[i], objs[i + 1], nxt) if nxt is not None else None
        if collapsed is not None:
            steps.append(collapsed)
            i += 2
            continue
        step = _safely(render_step, objs[i], objs[i + 1], redact=redact)
        if step is None:
            step = type(objs[i]).__name__
        if step:
            steps.append(step)
        i += 1
    return steps


def _unnamed_members(obj: object, member: object) -> int | None:
    n = opaque_size(obj, member)
    return n if n is not None else dynamic_attrs_size(obj, member)


def _safely(name_step: Callable[..., str | None], *args: Any, **kwargs: Any) -> str | None:
    """A step's name, or None when naming it failed: an object of the program whose reading raises (a user
    method reached despite the care in `edges`) costs its step's name, never the audit."""
    try:
        return name_step(*args, **kwargs)
    except Exception:
        return None


def _collections(chain: HolderChain, objs: list[Any]) -> None:
    """Bounds, collections (by type and by linked shape) and their sizes along the path."""
    for i, (nid, obj) in enumerate(zip(chain.nodes, objs)):
        b = declared_bound(obj)
        if b is not None:
            chain.bounds[nid] = b
        if is_collection(obj):
            n = safe_len(obj)
        else:  # a C object holding many members like the next one without naming them is one too, and so is
            # an instance holding them in attributes set by computed names
            n = _unnamed_members(obj, objs[i + 1]) if i + 1 < len(objs) else None
            if n is None:
                continue
        chain.containers.append(nid)
        if n is not None:
            chain.sizes[nid] = n
    edges = [edge_key(objs[i], objs[i + 1]) for i in range(len(objs) - 1)] + [""]
    for i, how in linked_runs([type(o) for o in objs], edges).items():
        nid = chain.nodes[i]
        chain.linked[nid] = how
        chain.sizes[nid] = linked_size(objs[i], how)
        if nid not in chain.containers:
            chain.containers.append(nid)
    order = {n: i for i, n in enumerate(chain.nodes)}
    chain.containers.sort(key=order.__getitem__)
