"""KVG402 global-kv-store: per-request KV or generate() outputs stored into module- or class-level state.

Fires on ``append``/``add``/``X[k] = v``... inside a function, or in a loop of module-level code (a script's
serve loop), into a container built at module or class level, when the value mentions a KV cache or a
``generate()`` result (directly or through a local) and nothing in the module ever removes from the container.

Fix: keep per-request results in the request's scope, or bound the container (``deque(maxlen=N)``, an LRU).

A key from a fixed set (a constant, ``i % N``, an Enum member...) bounds the table.

False positives: removal in another module, or keys from a fixed set defined elsewhere; silence with
``# noqa: KVG402``. Example: docs/design/lint.md.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kvguardian.lint.python import names as N
from kvguardian.lint.python.index import ModuleIndex, Store
from kvguardian.lint.rules.base import Hit, Rule, hit

ID = "KVG402"
_KINDS = {"call:append", "call:extend", "call:add", "call:insert", "call:appendleft", "call:extendleft",
          "call:setdefault", "call:update", "setitem"}


def unbounded_state(ix: ModuleIndex, s: Store) -> bool:
    """Is the store's target a module/class container that nothing bounds or empties?"""
    c = ix.containers.get(s.target)
    if c is None or c.bounded or s.target in ix.instance_attrs or s.target in ix.removed:
        return False
    attr = s.target.split(".", 1)[1] if "." in s.target else None
    return not (attr and f"*.{attr}" in ix.removed)


def fixed_key(ix: ModuleIndex, key: ast.AST | None, module_level: bool) -> bool:
    """Is a store's key drawn from a fixed set: a constant, an item of a literal tuple/list (``TENANTS[i % 3]``
    over a literal), a remainder ``i % N``, a loop variable over values written in the source, or a member of an
    Enum defined in the module? Such a table is bounded by its keys: each entry is replaced."""
    if key is None:
        return False
    if isinstance(key, ast.Constant):
        return True
    if isinstance(key, ast.Name):  # a module-level loop variable over values written in the source
        return module_level and key.id in ix.literal_loop_names
    if isinstance(key, ast.Subscript) and isinstance(key.value, (ast.Tuple, ast.List)):
        return True
    if isinstance(key, ast.BinOp) and isinstance(key.op, ast.Mod) and isinstance(key.right, ast.Constant):
        return True
    if isinstance(key, ast.Call) and isinstance(key.func, ast.Name):
        return any(b.rpartition(".")[2].endswith("Enum") for b in ix.class_bases.get(key.func.id, []))
    return False


def check(ix: ModuleIndex) -> Iterator[Hit]:
    for s in ix.stores:
        if s.kind not in _KINDS or (s.function is None and not s.serve_loop) or s.value is None:
            continue
        if not unbounded_state(ix, s) or (s.kind == "setitem" and fixed_key(ix, s.key, s.serve_loop)):
            continue
        if N.is_cache_expr(s.value, s.function.kv_names if s.function else ix.module_kv_names):
            where = "class" if "." in s.target else "module"
            yield hit(s.node, f"per-request KV or generate() output stored into {where}-level '{s.target}' "
                              "(nothing in this module bounds or empties it): every request's cache stays alive; "
                              "keep it in the request's scope or bound the container")


RULE = Rule(ID, "python", check, __doc__ or "")
