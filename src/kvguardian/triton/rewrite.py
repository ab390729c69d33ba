"""The AST rewrite behind `kvguardian.triton.sanitize`: pure Python, no Triton import.

Given a ``@triton.jit`` kernel's source and the names of its KV-cache pointer parameters, it finds every
``tl.load``/``tl.store`` whose pointer is computed from one of them (directly or through local variables),
hoists that access's pointer and mask into temporaries, and adds right after the statement a call to the
ownership check (`kvguardian.triton.checks.kv_check`, itself a Triton function) on exactly those values.
The kernel gains a few trailing parameters (the ownership tables, the violation buffer); nothing else in it
changes, so what it computes is unchanged.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass

from kvguardian.core.errors import UsageError

__all__ = ["EXTRA_PARAMS", "Rewritten", "SanitizerError", "Site", "rewrite_kernel"]

#: parameters appended to the kernel, in order (the per-cache ones are added per KV cache)
EXTRA_PARAMS = ("_kvg_buf", "_kvg_bt", "_kvg_bt_stride", "_kvg_lens", "_kvg_nseq", "_KVG_BS", "_KVG_MAXB")
CHECK_NAME = "_kvg_kv_check"


class SanitizerError(UsageError):
    """The kernel cannot be sanitized as asked; the message says which kernel, why, and the fix."""


@dataclass(frozen=True)
class Site:
    """One checked access: where it is in the kernel's own source file."""

    index: int
    kind: str  # "load" or "store"
    cache: str  # the KV-cache parameter it goes through
    line: int  # line in the kernel's source file
    text: str  # the statement, for messages


@dataclass(frozen=True)
class Rewritten:
    source: str  # the new function's source (no decorator)
    name: str
    params: tuple[str, ...]  # the original parameters
    sites: tuple[Site, ...]


def _tl_call(node: ast.AST, tl_names: set[str]) -> str | None:
    """``"load"``/``"store"`` for ``tl.load(...)``/``tl.store(...)`` (any alias of triton.language)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("load", "store"):
        base = node.func.value
        if isinstance(base, ast.Name) and base.id in tl_names:
            return node.func.attr
        if isinstance(base, ast.Attribute) and base.attr == "language":
            return node.func.attr
    return None


class _Rewriter:
    def __init__(self, caches: tuple[str, ...], tl_names: set[str], sequence: ast.expr, first_line: int) -> None:
        self.caches = caches
        self.tl_names = tl_names
        self.sequence = sequence
        self.first_line = first_line
        self.derived: dict[str, str] = {c: c for c in caches}  # local name -> the KV cache it points into
        self.sites: list[Site] = []
        self.lines: list[str] = []  # the original source lines, for the sites' text

    def cache_of(self, expr: ast.AST) -> str | None:
        for n in ast.walk(expr):
            if isinstance(n, ast.Name) and n.id in self.derived:
                return self.derived[n.id]
        return None

    def body(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in stmts:
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    setattr(stmt, field, self.body(inner))
            before, after = self.statement(stmt)
            out.extend(before)
            out.append(stmt)
            out.extend(after)
            self.track(stmt)
        return out

    def track(self, stmt: ast.stmt) -> None:
        """Names assigned from KV-cache pointer arithmetic point into that cache too."""
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
            if any(_tl_call(n, self.tl_names) for n in ast.walk(stmt.value)):
                return  # a loaded value is data, not a pointer
            cache = self.cache_of(stmt.value)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        if cache is not None:
                            self.derived[n.id] = cache
                        elif not isinstance(stmt, ast.AugAssign):
                            self.derived.pop(n.id, None)

    def statement(self, stmt: ast.stmt) -> tuple[list[ast.stmt], list[ast.stmt]]:
        if isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.FunctionDef)):
            exprs = [getattr(stmt, "iter", None), getattr(stmt, "test", None)]
            if any(e is not None and self._accesses(e) for e in exprs):
                raise SanitizerError(
                    f"a KV-cache tl.load/tl.store in the header of a {type(stmt).__name__.lower()} statement "
                    f"(line {self.first_line + stmt.lineno - 1}) cannot be checked; fix: load into a variable first")
            return [], []
        before: list[ast.stmt] = []
        after: list[ast.stmt] = []
        for call in self._accesses(stmt):
            kind = _tl_call(call, self.tl_names)
            assert kind is not None
            cache = self.cache_of(call.args[0]) if call.args else None
            if cache is None:
                continue
            i = len(self.sites)
            p, m = f"_kvg_p{i}", f"_kvg_m{i}"
            before.append(ast.Assign([ast.Name(p, ast.Store())], call.args[0], lineno=0))
            mask = self._mask(call, kind)
            if mask is not None:
                before.append(ast.Assign([ast.Name(m, ast.Store())], mask, lineno=0))
                self._set_mask(call, kind, ast.Name(m, ast.Load()))
            call.args[0] = ast.Name(p, ast.Load())
            after.append(self._check(i, p, m if mask is not None else None, cache, kind))
            line = self.first_line + stmt.lineno - 1
            text = self.lines[stmt.lineno - 1].strip() if stmt.lineno <= len(self.lines) else ast.unparse(stmt)
            self.sites.append(Site(i, kind, cache, line, text[:160]))
        return before, after

    def _accesses(self, node: ast.AST) -> list[ast.Call]:
        return [n for n in ast.walk(node) if isinstance(n, ast.Call) and _tl_call(n, self.tl_names)
                and n.args and self.cache_of(n.args[0]) is not None]

    @staticmethod
    def _mask(call: ast.Call, kind: str) -> ast.expr | None:
        pos = 1 if kind == "load" else 2
        if len(call.args) > pos:
            return call.args[pos]
        return next((k.value for k in call.keywords if k.arg == "mask"), None)

    @staticmethod
    def _set_mask(call: ast.Call, kind: str, value: ast.expr) -> None:
        pos = 1 if kind == "load" else 2
        if len(call.args) > pos:
            call.args[pos] = value
            return
        for k in call.keywords:
            if k.arg == "mask":
                k.value = value

    def _check(self, i: int, p: str, m: str | None, cache: str, kind: str) -> ast.stmt:
        names = lambda *xs: [ast.Name(x, ast.Load()) for x in xs]  # noqa: E731
        args = [
            ast.Name(p, ast.Load()),
            ast.Name(m, ast.Load()) if m else ast.Constant(1),
            ast.Name(cache, ast.Load()),
            *names(f"_kvg_blk_{cache}", f"_kvg_slot_{cache}", "_kvg_bt", "_kvg_bt_stride", "_kvg_lens", "_kvg_nseq"),
            self.sequence,
            ast.Name("_kvg_buf", ast.Load()),
            ast.Constant(i),
            ast.Constant(1 if kind == "load" else 0),
            *names("_KVG_BS", "_KVG_MAXB"),
        ]
        return ast.Expr(ast.Call(ast.Name(CHECK_NAME, ast.Load()), args, []))


def _tl_aliases(module_globals: dict[str, object]) -> set[str]:
    """The names under which the kernel's module imported ``triton.language`` (``tl`` when unknown)."""
    names = {name for name, value in module_globals.items() if getattr(value, "__name__", "") == "triton.language"}
    return names or {"tl"}


def rewrite_kernel(source: str, *, caches: tuple[str, ...], sequence: str = "tl.program_id(0)",
                   first_line: int = 1, module_globals: dict[str, object] | None = None,
                   kernel_name: str = "kernel") -> Rewritten:
    """Rewrite one kernel's source. ``first_line`` is the source's first line in its file.

    Raises:
        SanitizerError: no function, an unknown cache parameter, or no access through a KV-cache pointer.
    """
    tree = ast.parse(textwrap.dedent(source))
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)
    if fn is None:
        raise SanitizerError(f"{kernel_name}: no function definition in its source; pass the @triton.jit kernel")
    a = fn.args
    params = tuple(p.arg for p in (*a.posonlyargs, *a.args))
    missing = [c for c in caches if c not in params]
    if missing:
        raise SanitizerError(f"{kernel_name}: kv_caches names {', '.join(map(repr, missing))}, not parameters of the "
                             f"kernel ({', '.join(params)}); pass the KV-cache pointer parameters' names")
    seq_expr = ast.parse(sequence, mode="eval").body
    rw = _Rewriter(caches, _tl_aliases(module_globals or {}), seq_expr, first_line)
    rw.lines = textwrap.dedent(source).splitlines()
    fn.body = rw.body(fn.body)
    if not rw.sites:
        raise SanitizerError(f"{kernel_name}: no tl.load/tl.store goes through the KV-cache pointer(s) "
                             f"{', '.join(caches)}; nothing to check (is kv_caches right?)")
    extra = [*EXTRA_PARAMS[:5], *(f"_kvg_{k}_{c}" for c in caches for k in ("blk", "slot")), *EXTRA_PARAMS[5:]]
    fn.args.args.extend(ast.arg(x) for x in extra)
    if fn.args.defaults:
        fn.args.defaults.extend(ast.Constant(0) for _ in extra)
    for name in ("_KVG_BS", "_KVG_MAXB"):
        for arg in fn.args.args:
            if arg.arg == name:
                arg.annotation = ast.Attribute(ast.Name(next(iter(rw.tl_names)), ast.Load()), "constexpr", ast.Load())
    fn.decorator_list = []
    ast.fix_missing_locations(tree)
    return Rewritten(ast.unparse(fn), fn.name, params, tuple(rw.sites))
