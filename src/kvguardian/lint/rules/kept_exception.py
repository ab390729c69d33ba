"""KVG404 kept-exception: exceptions, tracebacks or ``sys.exc_info()`` kept in module-level state.

A kept exception holds its traceback's frames, and their locals hold the request's KV. Fires when a function, or
a loop of module-level code (a script's serve loop), stores into module- or class-level state a caught exception,
``sys.exc_info()``, a traceback or a frame (or a local assigned from one); formatted copies, set-up functions
(``*init*``, ``*load*``...) and module-level loops that try imports are not flagged.

Fix: keep plain data (``traceback.format_exc()``, ``repr(e)``), or ``traceback.clear_frames`` first.

False positives: state cleared right after reporting; silence with ``# noqa: KVG404``. Example:
docs/design/lint.md.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kvguardian.lint.python import names as N
from kvguardian.lint.python.index import ModuleIndex, Store
from kvguardian.lint.rules.base import Hit, Rule, hit

ID = "KVG404"
_SETUP = re.compile(r"(^|_)(init|load|import|setup|build|register|ensure|resolve|configure|install|compile|lazy|check|"
                    r"probe|detect|check_available)", re.IGNORECASE)


def check(ix: ModuleIndex) -> Iterator[Hit]:
    for s in ix.stores:
        f = s.function
        if (f is None and not s.serve_loop) or s.value is None:
            continue
        module_state = s.kind in ("global", "classattr") or (
            s.target in ix.containers and s.target not in ix.instance_attrs)
        if not module_state or not N.is_exc_expr(s.value, f.exc_names if f else ix.module_exc_names):
            continue
        if _SETUP.search(f.name if f else "") or (f is None and _imports_in_try(ix, s)):
            continue
        yield hit(s.node, f"exception/traceback kept in module-level '{s.target}': its frames keep their locals "
                          "(KV caches, tensors) alive; keep traceback.format_exc() or repr(e) instead")


def _imports_in_try(ix: ModuleIndex, s: Store) -> bool:
    """A module-level loop that tries imports (``for name in OPTIONAL: try: import_module(name)``) is set-up."""
    loop = next((n for n in ast.walk(ix.tree) if isinstance(n, (ast.For, ast.While)) and
                 any(c is s.node for c in ast.walk(n))), None)
    return loop is not None and any(
        isinstance(n, (ast.Import, ast.ImportFrom)) or (isinstance(n, ast.Call) and (N.dotted(n.func) or "").endswith(
            ("import_module", "__import__", "find_spec"))) for n in ast.walk(loop))


RULE = Rule(ID, "python", check, __doc__ or "")
