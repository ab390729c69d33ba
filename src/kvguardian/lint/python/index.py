"""One walk over a module's AST that records what the rules need, each fact with its context.

The walk keeps the stack of enclosing functions, classes and loops and whether gradients are off there
(``with torch.no_grad()``, ``@torch.inference_mode()``, a module-level ``torch.set_grad_enabled(False)``), and
tracks, per function, local names that hold KV caches or generate() outputs, timestamps/UUIDs, or exceptions.
Rules then read the facts (`ModuleIndex`) instead of walking the tree again.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from kvguardian.lint.python import names as N
from kvguardian.lint.python.redis import REDIS_WRITES, redis_keys

__all__ = ["CallEdge", "Container", "Function", "ModelCall", "ModuleIndex", "Store", "build_index"]

_STORE_METHODS = {"append", "extend", "add", "insert", "appendleft", "extendleft", "setdefault", "update",
                  "put", "put_nowait", "register", "push", "add_done_callback", "connect", "subscribe"}
_REMOVE_METHODS = {"pop", "popleft", "popitem", "remove", "clear", "discard", "__delitem__", "difference_update",
                   "intersection_update", "get_nowait", "unregister", "disconnect", "unsubscribe", "move_to_end",
                   "remove_done_callback"}
_EXPIRE = {"expire", "pexpire", "expireat", "pexpireat", "persist"}


@dataclass(eq=False)
class Function:
    """A function or method, with what is known of its context when it was entered."""

    node: ast.FunctionDef | ast.AsyncFunctionDef
    parent: Function | None
    class_name: str | None  # set when defined directly in a class body
    grad_off: bool  # decorated or enclosed by no_grad/inference_mode
    grad_on: bool  # decorated with enable_grad
    params: set[str] = field(default_factory=set)
    local_names: set[str] = field(default_factory=set)
    local_defs: set[str] = field(default_factory=set)
    kv_names: set[str] = field(default_factory=set)
    time_names: set[str] = field(default_factory=set)
    exc_names: set[str] = field(default_factory=set)
    global_names: set[str] = field(default_factory=set)
    trains: bool = False  # calls .backward() / optimizer.step(): gradients are wanted

    @property
    def name(self) -> str:
        return self.node.name


def lexically_grad_off(f: Function | None, module_off: bool) -> bool:
    """Gradients off in ``f``'s body by its own or an enclosing function's decorator, or module-wide."""
    while f is not None:
        if f.grad_on:
            return False
        if f.grad_off:
            return True
        f = f.parent
    return module_off


@dataclass(frozen=True)
class ModelCall:
    """A call that passes ``use_cache=True`` or a ``past_key_values=``/``cache=`` argument."""

    node: ast.Call
    function: Function | None
    loop: ast.AST | None  # innermost loop around it in the same function
    grad_off: bool
    fed: str | None  # the name passed as the cache, when it is a plain name or self.attr


@dataclass(frozen=True)
class Store:
    """Something put into a container or bound to module/class state."""

    node: ast.AST  # the call, assignment or subscript
    target: str  # container key: "NAME" (module), "Class.attr" (class), "self.attr" (instance)
    value: ast.AST | None
    function: Function | None
    kind: str  # "call:<method>", "setitem", "global", "classattr"
    key: ast.AST | None = None  # the subscript key of a setitem
    serve_loop: bool = False  # in a loop of module-level code (a script's serve loop), not in a function


@dataclass(frozen=True)
class Container:
    key: str  # "NAME" or "Class.attr"
    node: ast.AST
    bounded: bool


@dataclass(frozen=True)
class RedisCall:
    node: ast.Call
    method: str
    function: Function | None
    key_is_time: bool


@dataclass(frozen=True)
class CallEdge:
    """A call by simple name (``f(...)`` or ``x.f(...)``), for the module's call graph."""

    callee: str
    caller: Function | None
    grad_off: bool


@dataclass
class ModuleIndex:
    tree: ast.Module
    functions: list[Function] = field(default_factory=list)
    model_calls: list[ModelCall] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    containers: dict[str, Container] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)  # keys and "*.attr" with a removal or a reset anywhere
    redis_calls: list[RedisCall] = field(default_factory=list)
    expired: dict[int, set[str]] = field(default_factory=dict)  # id(function node) or 0 -> expired key texts
    module_grad_off: bool = False
    class_names: set[str] = field(default_factory=set)
    by_name: dict[str, list[Function]] = field(default_factory=dict)
    calls: list[CallEdge] = field(default_factory=list)
    instance_attrs: set[str] = field(default_factory=set)  # "Class.attr" bound in __init__ (shadows class attrs)
    #: local name -> what it names: "module.name" of from-imports, "module" of ``import module as name``
    imports: dict[str, str] = field(default_factory=dict)
    instance_containers: set[str] = field(default_factory=set)  # "Class.attr" bound to a dict/list in __init__
    temporary_classes: set[str] = field(default_factory=set)  # constructed only as `Cls(...).method(...)`
    kept_classes: set[str] = field(default_factory=set)  # constructed somewhere else too
    self_attrs: dict[str, set[str]] = field(default_factory=dict)  # class name -> attributes read as self.X
    class_bases: dict[str, list[str]] = field(default_factory=dict)  # class name -> dotted base names
    import_roots: set[str] = field(default_factory=set)  # top-level packages imported anywhere in the module
    module_kv_names: set[str] = field(default_factory=set)  # module-level names bound to a KV cache or output
    module_exc_names: set[str] = field(default_factory=set)  # module-level names bound to a caught exception
    literal_names: set[str] = field(default_factory=set)  # module-level names bound to a literal list/tuple/set
    literal_loop_names: set[str] = field(default_factory=set)  # module-level loop targets over one


def _record_import(ix: ModuleIndex, node: ast.Import | ast.ImportFrom) -> None:
    """Note an import's top-level package and the local names it binds (`ModuleIndex.imports`)."""
    if isinstance(node, ast.Import):
        ix.import_roots.update(a.name.split(".", 1)[0] for a in node.names)
        ix.imports.update((a.asname, a.name) for a in node.names if a.asname)
        return
    if node.module and not node.level:
        ix.import_roots.add(node.module.split(".", 1)[0])
    for a in node.names:
        ix.imports[a.asname or a.name] = f"{node.module or ''}.{a.name}"


def _module_imports(ix: ModuleIndex, body: list[ast.stmt]) -> None:
    """Module-level imports (also under ``if``/``try``/``with``), known before the walk: a module-level
    ``set_grad_enabled(False)`` or a decorator may come before the import it names."""
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            _record_import(ix, stmt)
        elif isinstance(stmt, (ast.If, ast.Try, ast.With, ast.AsyncWith)):
            for block in ("body", "orelse", "handlers", "finalbody"):
                _module_imports(ix, getattr(stmt, block, []))
        elif isinstance(stmt, ast.ExceptHandler):
            _module_imports(ix, stmt.body)


def _literal(node: ast.AST, names: set[str], inner: bool = False) -> bool:
    """A sequence of values written in the source: a list/tuple/set display, a comprehension over ``range`` of a
    constant, a sum of those, a name bound to one, or ``enumerate``/``sorted``/``reversed`` of one. A loop
    straight over ``range(n)`` is not one: in a script it stands for n requests."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return True
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left, names, inner) and _literal(node.right, names, inner)
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        return all(_literal(g.iter, names, inner=True) for g in node.generators)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
        if node.func.id == "range":
            return inner and all(isinstance(a, ast.Constant) for a in node.args)
        return node.func.id in ("enumerate", "sorted", "reversed") and _literal(node.args[0], names, inner)
    return False


class _Walker:
    def __init__(self, tree: ast.Module) -> None:
        self.ix = ModuleIndex(tree)
        self.func: Function | None = None
        self.cls: list[str] = []
        self.loops: list[ast.AST] = []
        self.grad: list[int] = []  # with-block grad effects, innermost last
        self.in_class_body = False
        self.temporaries: set[int] = set()  # ids of `Cls(...)` calls used as `Cls(...).attr`

    # ------------------------------------------------------------------ context
    def grad_off(self) -> bool:
        for eff in reversed(self.grad):
            if eff:
                return eff < 0
        return lexically_grad_off(self.func, self.ix.module_grad_off)

    def owner_key(self, node: ast.AST) -> list[str]:
        """Container keys a receiver expression may name."""
        if isinstance(node, ast.Name):
            if self.func is None or node.id in self.func.global_names or node.id not in self._locals():
                return [node.id]
            return []
        if isinstance(node, ast.Attribute):
            base = N.dotted(node.value)
            keys = [f"*.{node.attr}"]
            if self.cls and base in ("self", "cls", self.cls[-1], "self.__class__", "type(self)"):
                keys.insert(0, f"{self.cls[-1]}.{node.attr}")
            elif base in self.ix.class_names:
                keys.insert(0, f"{base}.{node.attr}")
            elif base and base.rpartition(".")[2] in self.ix.class_names:  # a nested class: Outer.Inner, self.Inner
                keys.insert(0, f"{base.rpartition('.')[2]}.{node.attr}")
            return keys
        return []

    def _locals(self) -> set[str]:
        f = self.func
        return (f.params | f.local_names) if f else set()

    # ------------------------------------------------------------------ walk
    def visit(self, node: ast.AST) -> None:
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is not None:
            method(node)
        else:
            self.children(node)

    def children(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def visit_Module(self, node: ast.Module) -> None:
        for stmt in node.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                    and N.grad_effect(stmt.value, self.ix.imports) < 0:
                self.ix.module_grad_off = True
        self.children(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.ix.class_names.add(node.name)
        self.ix.class_bases[node.name] = [N.dotted(b) or "" for b in node.bases]
        outer = self.func, self.loops, self.grad
        self.func, self.loops, self.grad = None, [], []
        self.cls.append(node.name)
        for d in node.decorator_list:
            self.visit(d)
        for stmt in node.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                self._class_attr(node.name, stmt)
            self.in_class_body = True
            self.visit(stmt)
        self.in_class_body = False
        self.cls.pop()
        self.func, self.loops, self.grad = outer

    def _class_attr(self, cls: str, stmt: ast.Assign | ast.AnnAssign) -> None:
        kind = N.container_kind(stmt.value)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for t in targets:
            if kind and isinstance(t, ast.Name):
                key = f"{cls}.{t.id}"
                self.ix.containers[key] = Container(key, stmt, kind == "bounded")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.decorator_list:
            self.visit(d)
        for default in (*node.args.defaults, *node.args.kw_defaults):
            if default is not None:
                self.visit(default)
        effects = [N.grad_effect(d, self.ix.imports) for d in node.decorator_list]
        cls = self.cls[-1] if self.in_class_body and self.func is None and self.cls else None
        f = Function(node, self.func, cls, grad_off=-1 in effects, grad_on=1 in effects)
        a = node.args
        f.params = {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
        f.params |= {p.arg for p in (a.vararg, a.kwarg) if p is not None}
        if self.func is not None:
            self.func.local_defs.add(node.name)
            self.func.local_names.add(node.name)
        self.ix.functions.append(f)
        self.ix.by_name.setdefault(node.name, []).append(f)
        outer = self.func, self.loops, self.grad, self.in_class_body
        self.func, self.loops, self.grad, self.in_class_body = f, [], [], False
        for stmt in node.body:
            self.visit(stmt)
        self.func, self.loops, self.grad, self.in_class_body = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.children(node)

    def visit_Import(self, node: ast.Import) -> None:
        _record_import(self.ix, node)

    visit_ImportFrom = visit_Import

    def visit_Global(self, node: ast.Global) -> None:
        if self.func is not None:
            self.func.global_names.update(node.names)

    def visit_For(self, node: ast.For | ast.AsyncFor | ast.While) -> None:
        if not isinstance(node, ast.While):
            self._bind(node.target, node.iter)
            if self.func is None and not self.cls and _literal(node.iter, self.ix.literal_names):
                self.ix.literal_loop_names.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        self.loops.append(node)
        self.children(node)
        self.loops.pop()

    visit_AsyncFor = visit_While = visit_For

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        effect = 0
        for item in node.items:
            self.visit(item.context_expr)
            effect = N.grad_effect(item.context_expr, self.ix.imports) or effect
            if item.optional_vars is not None:
                self._bind(item.optional_vars, item.context_expr)
        self.grad.append(effect)
        for stmt in node.body:
            self.visit(stmt)
        self.grad.pop()

    visit_AsyncWith = visit_With

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name and self.func is not None:
            self.func.exc_names.add(node.name)
            self.func.local_names.add(node.name)
        elif node.name and not self.cls:
            self.ix.module_exc_names.add(node.name)
        self.children(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        if self.func is None and not self.cls:
            kind = N.container_kind(node.value)
            for t in node.targets:
                if kind and isinstance(t, ast.Name):
                    self.ix.containers[t.id] = Container(t.id, node, kind == "bounded")
                if isinstance(t, ast.Name) and _literal(node.value, set()):
                    self.ix.literal_names.add(t.id)
        for t in node.targets:
            self._assign_target(t, node.value, node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            return
        self.visit(node.value)
        if self.func is None and not self.cls:
            kind = N.container_kind(node.value)
            if kind and isinstance(node.target, ast.Name):
                self.ix.containers[node.target.id] = Container(node.target.id, node, kind == "bounded")
        self._assign_target(node.target, node.value, node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Subscript):
            self.visit(node.target.value)
        keys = self.owner_key(node.target) if isinstance(node.target, (ast.Name, ast.Attribute)) else []
        for k in keys[:1]:
            if isinstance(node.op, ast.Add) and isinstance(node.value, (ast.List, ast.Tuple)):
                self._store(node, k, node.value, "call:extend")
            elif isinstance(node.op, (ast.Sub, ast.BitAnd)):
                self.ix.removed.add(k)
        if isinstance(node.target, ast.Name) and self.func is not None:
            self.func.local_names.add(node.target.id)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            base = t.value if isinstance(t, ast.Subscript) else t
            self.ix.removed.update(self.owner_key(base) if isinstance(base, (ast.Name, ast.Attribute)) else [])
            self.visit(t)

    def _assign_target(self, t: ast.AST, value: ast.AST, node: ast.AST) -> None:
        if isinstance(t, ast.Subscript):
            self.visit(t.value)
            self.visit(t.slice)
            recv = t.value
            if isinstance(t.slice, ast.Slice):  # X[:] = ..., X[-n:] = ...: a reset
                self.ix.removed.update(self._keys_of(recv))
                return
            for k in self._keys_of(recv)[:1]:
                self._store(node, k, value, "setitem", key=t.slice)
            return
        if isinstance(t, ast.Attribute):
            self.visit(t.value)
            keys = self.owner_key(t)
            if self.func is not None and self.func.name == "__init__" and keys:
                self.ix.instance_attrs.add(keys[0])
                if N.container_kind(value) == "unbounded":
                    self.ix.instance_containers.add(keys[0])
            if self.func is not None and self.func.name != "__init__" and keys:
                self.ix.removed.update(keys)  # rebinding the attribute outside __init__ resets it
            base = N.dotted(t.value)
            if keys and self.func is not None and (base in self.ix.class_names or base in ("cls", "self.__class__")):
                self.ix.stores.append(Store(node, keys[0], value, self.func, "classattr"))
            return
        if isinstance(t, ast.Name):
            if self.func is not None and t.id in self.func.global_names:
                self.ix.removed.add(t.id)
                self.ix.stores.append(Store(node, t.id, value, self.func, "global"))
            else:
                self._bind(t, value)
            return
        if isinstance(t, (ast.Tuple, ast.List)):
            for elt in t.elts:
                self._assign_target(elt.value if isinstance(elt, ast.Starred) else elt, value, node)

    def _store(self, node: ast.AST, target: str, value: ast.AST | None, kind: str, key: ast.AST | None = None) -> None:
        loop = self.func is None and not self.cls and bool(self.loops)
        self.ix.stores.append(Store(node, target, value, self.func, kind, key=key, serve_loop=loop))

    def _keys_of(self, recv: ast.AST) -> list[str]:
        return self.owner_key(recv) if isinstance(recv, (ast.Name, ast.Attribute)) else []

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        f = self.func
        names = [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
        if f is None:  # module-level code: cache and exception names matter (stores in its loops)
            if not self.cls and N.is_cache_expr(value, self.ix.module_kv_names):
                self.ix.module_kv_names.update(names)
            if not self.cls and N.is_exc_expr(value, self.ix.module_exc_names):
                self.ix.module_exc_names.update(names)
            return
        f.local_names.update(names)
        if N.is_cache_expr(value, f.kv_names):
            f.kv_names.update(names)
        if N.is_time_expr(value, f.time_names, self.ix.imports):
            f.time_names.update(names)
        if N.is_exc_expr(value, f.exc_names):
            f.exc_names.update(names)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._bind(node.target, node.value)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self.cls and isinstance(node.value, ast.Name) and node.value.id == "self":
            self.ix.self_attrs.setdefault(self.cls[-1], set()).add(node.attr)
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            self.ix.temporary_classes.add(node.value.func.id)
            self.temporaries.add(id(node.value))
        self.children(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id[:1].isupper() and id(node) not in self.temporaries:
            self.ix.kept_classes.add(node.func.id)
        self.children(node)
        method = N.method_of(node)
        if method is not None:
            self._method_call(node, method)
        cached = N.keyword(node, "past_key_values")
        if cached is None:
            cached = N.keyword(node, "cache")
        if (N.is_true(N.keyword(node, "use_cache")) or (cached is not None and not N.is_none(cached))) \
                and method not in ("generate",):
            fed = N.dotted(cached) if cached is not None else None
            loop = self.loops[-1] if self.loops else None
            self.ix.model_calls.append(ModelCall(node, self.func, loop, self.grad_off(), fed))
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else \
            (node.func.id if isinstance(node.func, ast.Name) else None)
        if callee:
            self.ix.calls.append(CallEdge(callee, self.func, self.grad_off()))

    def _method_call(self, node: ast.Call, method: str) -> None:
        assert isinstance(node.func, ast.Attribute)
        recv = node.func.value
        if method in ("backward", "step", "zero_grad") and self.func is not None:
            self.func.trains = True
        if method in _STORE_METHODS:
            value: ast.AST | None = node.args[-1] if node.args else (node.keywords[0].value if node.keywords else None)
            key = node.args[0] if method == "setdefault" and node.args else None
            for k in self._keys_of(recv)[:1]:
                self._store(node, k, value, f"call:{method}", key=key)
        if method in _REMOVE_METHODS:
            self.ix.removed.update(self._keys_of(recv))
            if isinstance(recv, ast.Attribute):
                self.ix.removed.add(f"*.{recv.attr}")
        if method in REDIS_WRITES:
            tainted = self.func.time_names if self.func else set()
            is_time = any(N.is_time_expr(k, tainted, self.ix.imports) for k in redis_keys(node, method))
            self.ix.redis_calls.append(RedisCall(node, method, self.func, is_time))
        elif method in _EXPIRE and node.args:
            fid = id(self.func.node) if self.func else 0
            self.ix.expired.setdefault(fid, set()).add(ast.unparse(node.args[0]))


def build_index(tree: ast.Module) -> ModuleIndex:
    """Walk ``tree`` once. Raises RecursionError for absurdly nested code (the caller skips the file)."""
    w = _Walker(tree)
    _module_imports(w.ix, tree.body)
    w.visit(tree)
    return w.ix
