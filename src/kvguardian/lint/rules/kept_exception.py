"""KVG404 kept-exception: exceptions, tracebacks or ``sys.exc_info()`` kept in module-level state.

Anti-pattern::

    FAILED = []
    def handle(req):
        try:
            run(req)                       # a frame below holds the request's KV cache
        except Exception as e:
            FAILED.append(e)               # e.__traceback__ -> frames -> locals -> the cache, forever

Fix: keep what you need to report as plain data: ``traceback.format_exc()``, ``repr(e)``, the type name;
or call ``traceback.clear_frames(e.__traceback__)`` before keeping the exception.

Fires inside a function on ``X.append(e)``/``X[k] = e``/``global X; X = e``/``Class.X = e`` where ``X`` is module- or
class-level state and the value is the bound exception of an ``except ... as e``, ``sys.exc_info()``,
``sys.exception()``, a ``__traceback__``/``tb_frame`` attribute, a frame (``inspect.currentframe()``,
``sys._getframe()``), or a local name assigned from one. Formatted copies (``str(e)``, f-strings,
``traceback.format_*``) are not flagged, nor are errors kept by set-up functions (``*init*``, ``*load*``,
``*import*``, ``*setup*``, ``*register*``…): their frames hold start-up state, not a request's cache.

False positives: a module that clears the state right after reporting it still holds the frames until
then; if that window is short and bounded, silence with ``# noqa: KVG404``.
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
