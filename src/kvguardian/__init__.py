"""kv-guardian: find, prove and prevent KV-cache leaks in LLM inference and key-space leaks in Redis.

``import kvguardian`` imports neither torch nor transformers; they load when a model is attached or a
reproduction runs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kvguardian import _moved

__version__ = "0.1.0"

# A library logs, the application decides where it goes: nothing reaches stderr through logging's
# last-resort handler (kv-guardian's own CLI adds a one-line stderr handler).
logging.getLogger("kvguardian").addHandler(logging.NullHandler())

# 0.1's module paths (kvguardian.core.ledger, kvguardian.runtime.hf, ...) still import, with a DeprecationWarning
_moved.install()

__all__ = [
    "CATALOG",
    "EntryState",
    "Finding",
    "Guard",
    "Ledger",
    "Report",
    "Severity",
    "__version__",
]

if TYPE_CHECKING:  # pragma: no cover
    from kvguardian.core.findings import CATALOG, Finding, Report, Severity
    from kvguardian.core.ledger import EntryState, Ledger
    from kvguardian.runtime.guard import Guard

_LAZY = {
    "CATALOG": "kvguardian.core.findings",
    "Finding": "kvguardian.core.findings",
    "Report": "kvguardian.core.findings",
    "Severity": "kvguardian.core.findings",
    "Guard": "kvguardian.runtime.guard",
    "Ledger": "kvguardian.core.ledger",
    "EntryState": "kvguardian.core.ledger",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvguardian' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
