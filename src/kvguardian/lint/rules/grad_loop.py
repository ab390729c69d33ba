"""KVG401 grad-tracked-decode-loop: a manual decode loop outside ``no_grad``/``inference_mode`` (article §2.1).

Anti-pattern::

    for _ in range(512):
        out = model(ids, past_key_values=past, use_cache=True)   # under grad mode (the default)
        past = out.past_key_values                              # fed back: every step's graph is kept

Each step's K/V then carries a ``grad_fn`` whose graph reaches every earlier step: memory grows with the
square of the length instead of linearly (measured here: 430 MiB of saved tensors for a 2 MiB cache).

Fix: decorate the function with ``@torch.inference_mode()`` (or ``@torch.no_grad()``), or wrap the loop.

Fires, in a module that imports torch or transformers, on a call inside a loop that passes
``past_key_values=``/``cache=`` a name the same loop assigns again (the cache fed back; also an attribute of such
a name, ``out.past_key_values`` after ``out = model(...)``), when neither the call's
``with`` blocks, the decorators of its function or of an enclosing function, a module-level
``torch.set_grad_enabled(False)``, nor every caller of the function in the module turns gradients off.
``generate()`` is never flagged: it is decorated with ``no_grad`` itself.

False positives: a caller in another module that disables grad (the function is only ever called under
``no_grad``) is invisible; a loop that trains on purpose is skipped only when its function calls
``.backward()``/``.step()``. Silence with ``# noqa: KVG401`` and say why.
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
