"""KVG401 grad-tracked-decode-loop: a manual decode loop outside ``no_grad``/``inference_mode`` (article §2.1).

Each step's K/V then keeps a ``grad_fn`` reaching every earlier step: memory grows with the square of the
length. Fires, where torch or transformers is imported, on a call in a loop passing ``past_key_values=`` or
``cache=`` a name the loop reassigns, unless a ``with`` block, a decorator, ``set_grad_enabled(False)`` or every
caller in the module turns gradients off. ``generate()`` is never flagged.

Fix: ``@torch.inference_mode()`` (or ``@torch.no_grad()``) on the function, or around the loop.

False positives: a caller in another module that disables grad; silence with ``# noqa: KVG401``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kvguardian.lint.python.index import Function, ModuleIndex, lexically_grad_off
from kvguardian.lint.rules.base import Hit, Rule, describe, hit

ID = "KVG401"


def _assigned(loop: ast.AST, for_targets: bool = True) -> set[str]:
    """Names and ``self.X`` attributes the loop assigns (its own and inner loops' variables when
    ``for_targets``)."""
    out: set[str] = set()
    for n in ast.walk(loop):
        targets: list[ast.AST] = []
        if isinstance(n, ast.Assign):
            targets = list(n.targets)
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) or (
                for_targets and isinstance(n, (ast.For, ast.AsyncFor))):
            targets = [n.target]
        for t in targets:
            for m in ast.walk(t):
                name = m.id if isinstance(m, ast.Name) else (
                    f"self.{m.attr}" if isinstance(m, ast.Attribute) and isinstance(m.value, ast.Name)
                    and m.value.id == "self" else None)
                if name:
                    out.add(name)
    return out


def _fed_back(fed: str, loop: ast.AST) -> bool:
    """Is the cache passed (``past``, ``self.past``, ``out.past_key_values``) assigned again in the loop? For an
    attribute of a name, the name is (``out = model(..., past_key_values=out.past_key_values)``, the Hugging Face
    manual loop); a loop variable's attribute (``for batch in loader``) is a new cache each step, not fed back."""
    if fed in _assigned(loop):
        return True
    head, _, rest = fed.partition(".")
    owner = f"self.{rest.partition('.')[0]}" if head == "self" else head
    return bool(rest) and owner != fed and owner in _assigned(loop, for_targets=False)


def grad_off_functions(ix: ModuleIndex) -> set[int]:
    """ids of functions whose gradients are off: lexically, or at every call site in the module."""
    off = {id(f) for f in ix.functions if lexically_grad_off(f, ix.module_grad_off)}
    edges: dict[str, list[tuple[Function | None, bool]]] = {}
    for e in ix.calls:
        edges.setdefault(e.callee, []).append((e.caller, e.grad_off))
    changed = True
    while changed:
        changed = False
        for f in ix.functions:
            sites = edges.get(f.name)
            if id(f) in off or not sites or f.grad_on:
                continue
            if all(g or (c is not None and id(c) in off) for c, g in sites):
                off.add(id(f))
                changed = True
    return off


_TORCH = {"torch", "transformers", "peft", "accelerate", "optimum"}


def check(ix: ModuleIndex) -> Iterator[Hit]:
    if not ix.import_roots & _TORCH:
        return  # gradients are a torch concept: MLX, JAX and numpy loops take the same arguments
    off: set[int] | None = None
    for mc in ix.model_calls:
        if mc.grad_off or mc.loop is None or mc.fed is None:
            continue
        if not _fed_back(mc.fed, mc.loop):
            continue
        f = mc.function
        if f is not None:
            if any(g.trains for g in _chain(f)):
                continue
            if off is None:
                off = grad_off_functions(ix)
            if any(id(g) in off for g in _chain(f)):
                continue
        yield hit(mc.node, f"decode loop feeds '{mc.fed}' back into {describe(mc.node.func)}(...) with gradients "
                           "on: each step's autograd graph stays reachable from the cache; run the loop under "
                           "torch.inference_mode() or torch.no_grad()")


def _chain(f: Function | None) -> Iterator[Function]:
    while f is not None:
        yield f
        f = f.parent


RULE = Rule(ID, "python", check, __doc__ or "")
