"""KVG404 kept-exception: exceptions, tracebacks or ``sys.exc_info()`` kept in module-level state.

A kept exception holds its traceback's frames, and their locals hold the request's KV. Fires when a function
stores into module- or class-level state a caught exception, ``sys.exc_info()``, a traceback or a frame (or a
local assigned from one); formatted copies and set-up functions (``*init*``, ``*load*``...) are not flagged.

Fix: keep plain data (``traceback.format_exc()``, ``repr(e)``), or ``traceback.clear_frames`` first.

False positives: state cleared right after reporting; silence with ``# noqa: KVG404``. Example:
docs/design/lint.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kvguardian.lint.python import names as N
from kvguardian.lint.python.index import ModuleIndex
from kvguardian.lint.rules.base import Hit, Rule, hit

ID = "KVG404"
_SETUP = re.compile(r"(^|_)(init|load|import|setup|build|register|ensure|resolve|configure|install|compile|lazy|check|"
                    r"probe|detect|check_available)", re.IGNORECASE)


def check(ix: ModuleIndex) -> Iterator[Hit]:
    for s in ix.stores:
        f = s.function
        if f is None or s.value is None:
            continue
        module_state = s.kind in ("global", "classattr") or (
            s.target in ix.containers and s.target not in ix.instance_attrs)
        if not module_state or not N.is_exc_expr(s.value, f.exc_names) or _SETUP.search(f.name):
            continue
        yield hit(s.node, f"exception/traceback kept in module-level '{s.target}': its frames keep their locals "
                          "(KV caches, tensors) alive; keep traceback.format_exc() or repr(e) instead")


RULE = Rule(ID, "python", check, __doc__ or "")
