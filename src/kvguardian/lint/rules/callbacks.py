"""KVG406 handler-callback-registry: a request handler appends a closure to a module-level list for good.

Fires inside a request handler (a route, an ``async def``, a ``handle*``/``generate*``/... function) that registers
a closure, a ``functools.partial`` or a local object's bound method into a module- or class-level container that
nothing in the module removes from, or with ``atexit.register`` (no ``atexit.unregister``). In Go and Java, a
closure that captures the handler's KV and is kept (`kvguardian.lint.treesitter.closures`).

Fix: register callbacks once at start-up, or remove the request's callback when it ends.

False positives: a set-up handler that runs once, a removal in another file; silence with ``# noqa: KVG406``
(``// noqa: KVG406`` in Go/Java). Example: docs/design/lint.md.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kvguardian.lint.python import names as N
from kvguardian.lint.python.index import Function, ModuleIndex, Store
from kvguardian.lint.rules.base import Hit, Rule, hit
from kvguardian.lint.rules.global_store import unbounded_state

ID = "KVG406"
_ROUTES = {"get", "post", "put", "delete", "patch", "route", "websocket", "api_route", "head", "options",
           "on_message", "message_handler", "handler"}
HANDLER_NAME = re.compile(r"^_*(handle|generate|predict|infer|serve|chat|complete|completion|stream|on_request|"
                           r"process_request|respond)", re.IGNORECASE)
REQUEST_PARAMS = {"request", "req", "prompt", "websocket", "ws", "messages"}
_KINDS = {"call:append", "call:add", "call:insert", "call:appendleft", "call:register", "call:extend",
          "call:connect", "call:subscribe", "setitem"}


def is_handler(f: Function | None) -> bool:
    while f is not None:
        for d in f.node.decorator_list:
            name = N.dotted(d.func if isinstance(d, ast.Call) else d) or ""
            if name.rsplit(".", 1)[-1] in _ROUTES and "." in name:
                return True
        if isinstance(f.node, ast.AsyncFunctionDef) or HANDLER_NAME.match(f.name) or f.params & REQUEST_PARAMS:
            return True
        f = f.parent
    return False


def _captures(value: ast.AST, f: Function) -> bool:
    """Is ``value`` a closure or bound method holding the handler's local state? A cache attribute
    (``out.past_key_values``) is data, not a bound method."""
    local = (f.params | f.local_names) - {"self", "cls"}
    if isinstance(value, ast.Lambda):
        own = {a.arg for a in (*value.args.posonlyargs, *value.args.args, *value.args.kwonlyargs)}
        return bool((N.names_in(value.body) - own) & local)
    if isinstance(value, ast.Name):
        return value.id in f.local_defs
    if isinstance(value, ast.Call):
        name = N.dotted(value.func) or ""
        return name.rsplit(".", 1)[-1] == "partial" and any(N.names_in(a) & local for a in value.args[1:])
    if isinstance(value, ast.Attribute):
        if N.is_cache_expr(value, f.kv_names):
            return False  # `out.past_key_values` is data, not a bound method: KVG402's case
        root = value
        while isinstance(root, ast.Attribute):
            root = root.value  # type: ignore[assignment]
        return isinstance(root, ast.Name) and root.id in local
    return False


#: process-wide registries reached through a module: ``atexit.register(cb)``
_MODULE_REGISTRIES = {"atexit"}


def _kept(ix: ModuleIndex, s: Store) -> bool:
    if s.target in _MODULE_REGISTRIES and s.kind == "call:register":
        return s.target not in ix.removed  # atexit.unregister(cb) takes it back
    return unbounded_state(ix, s)


def check(ix: ModuleIndex) -> Iterator[Hit]:
    for s in ix.stores:
        f = s.function
        if s.kind not in _KINDS or f is None or s.value is None or not _kept(ix, s):
            continue
        if _captures(s.value, f) and is_handler(f):
            yield hit(s.node, f"request handler {f.name}() adds a callback/closure to module-level '{s.target}' "
                              "and nothing removes it: it keeps the request's locals (caches) alive; remove it "
                              "when the request ends or register once at start-up")


RULE = Rule(ID, "python", check, __doc__ or "")
