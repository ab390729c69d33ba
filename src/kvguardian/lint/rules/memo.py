"""KVG403 unbounded-memo: memoisation that keeps caches, outputs or ``self`` alive (article §2.5).

Fires on ``functools.cache``/``lru_cache(maxsize=None)`` over parameters or results that are caches, tensors,
outputs or models, and on any ``cache``/``lru_cache`` on a method of a model-holding class (the memo keeps
``self``). Memos keyed by shapes or without parameters, and ``lru_cache(maxsize=1)``, are not flagged.

Fix: bound the memo and key it by plain values; on methods use ``cached_property`` or a per-instance dict.

False positives: a model-holding class built once per process; silence with ``# noqa: KVG403``. The exact
rules: docs/design/lint.md.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kvguardian.lint.python import names as N
from kvguardian.lint.python.index import Function, ModuleIndex
from kvguardian.lint.rules.base import Hit, Rule, hit

ID = "KVG403"
_CACHE_DECOS = {"functools.cache", "functools.lru_cache"}
_PARAM_KINDS = re.compile(r"\bTensor\b|\w*Cache\b|\w*Output\b|\bnn\.Module\b|\w*Model\b|\bndarray\b")
_RETURN_KINDS = re.compile(r"\w*Cache\b|\w*Output\b")
#: classes that hold a model's weights, caches or buffers: a memo pinning one of them pins all of that
_HEAVY = re.compile(r"(Module|Model|ForCausalLM|ForConditionalGeneration|Transformer\w*|Attention|Embed\w*|Rope|"
                    r"Layer|Decoder|Encoder|Runner|Engine|Pipeline|Stage|Processor|Tokenizer|Generator|Worker)$")


def _memo(deco: ast.expr, ix: ModuleIndex) -> tuple[str, bool, int | None] | None:
    """(name, unbounded, maxsize if a literal) for a functools memo decorator, else None."""
    target = deco.func if isinstance(deco, ast.Call) else deco
    qual = N.resolve(N.dotted(target), ix.imports)  # functools.cache, ft.cache, cache (from functools)
    if qual not in _CACHE_DECOS:
        return None
    short = qual.rsplit(".", 1)[-1]
    if short == "cache":
        return short, True, None
    if not isinstance(deco, ast.Call):
        return short, False, 128  # lru_cache's default maxsize
    size = deco.args[0] if deco.args else N.keyword(deco, "maxsize")
    literal = size.value if isinstance(size, ast.Constant) and isinstance(size.value, int) else None
    return short, size is not None and N.is_none(size), literal


def _takes_or_returns_kv(f: Function) -> bool:
    a = f.node.args
    if not (a.posonlyargs or a.args or a.kwonlyargs or a.vararg or a.kwarg):
        return False  # no arguments: one entry, a singleton, bounded
    for p in (*a.posonlyargs, *a.args, *a.kwonlyargs):
        ann = ast.unparse(p.annotation) if p.annotation is not None else ""
        if N.is_cache_expr(ast.Name(p.arg), set()) or _PARAM_KINDS.search(ann):
            return True
    if f.node.returns is not None and _RETURN_KINDS.search(ast.unparse(f.node.returns)):
        return True
    for n in ast.walk(f.node):
        if isinstance(n, ast.Return) and n.value is not None and N.is_cache_expr(n.value, f.kv_names):
            return True
    return False


_MODEL_ATTRS = {"model", "engine", "llm", "tokenizer", "processor", "pipeline", "pipe", "kv_cache", "cache",
                "past_key_values", "caches", "weights", "module"}


def _heavy_class(ix: ModuleIndex, cls: str, depth: int = 0) -> bool:
    """Does the class hold model state: by its name or a base's, by ``self.model``-like attributes, or through
    a base class defined in this module that does?"""
    bases = ix.class_bases.get(cls, [])
    if any(_HEAVY.search(n.rsplit(".", 1)[-1]) for n in (cls, *bases) if n):
        return True
    if ix.self_attrs.get(cls, set()) & _MODEL_ATTRS:
        return True
    return depth < 8 and any(b in ix.class_bases and _heavy_class(ix, b, depth + 1) for b in bases)


def _is_method(f: Function) -> bool:
    if f.class_name is None:
        return False
    decos = {N.dotted(d.func if isinstance(d, ast.Call) else d) for d in f.node.decorator_list}
    if decos & {"staticmethod", "classmethod"}:
        return False
    args = f.node.args.posonlyargs + f.node.args.args
    return bool(args) and args[0].arg == "self"


def check(ix: ModuleIndex) -> Iterator[Hit]:
    for f in ix.functions:
        for deco in f.node.decorator_list:
            memo = _memo(deco, ix)
            if memo is None:
                continue
            name, unbounded, maxsize = memo
            if maxsize is not None and maxsize <= 1:
                break  # holds only the latest caller: a new instance's first call releases the old one
            if _is_method(f) and f.class_name and _heavy_class(ix, f.class_name):
                yield hit(deco, f"@{name} on method {f.class_name}.{f.name}: the memo keeps every 'self' it saw "
                                "alive (and what it holds: models, caches); use functools.cached_property or a "
                                "per-instance dict")
            elif unbounded and not _is_method(f) and _takes_or_returns_kv(f):
                yield hit(deco, f"unbounded @{name} on {f.name}(), which takes or returns caches/tensors/outputs: "
                                "each one is kept forever; bound it and key it by plain values")
            break


RULE = Rule(ID, "python", check, __doc__ or "")
