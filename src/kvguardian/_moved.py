"""Old module paths, kept importable for one release.

The package is grouped into wings (`core`, `runtime`, `ops`, `isolation`; see ARCHITECTURE.md). Code that
still imports an old path (``from kvguardian.ledger import Ledger``) gets the very same module object as the
new path, with one `DeprecationWarning` naming the new one. ``scripts/rewrite_imports.py`` rewrites a tree.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: old top-level name under ``kvguardian.`` -> its new dotted path under ``kvguardian.``
MOVED: dict[str, str] = {
    "_errors": "core.errors",
    "_faults": "core.faults",
    "findings": "core.findings",
    "options": "core.options",
    "input_file": "core.input_file",
    "ledger": "core.ledger",
    "tensors": "core.tensors",
    "detectors": "core.detectors",
    "report": "core.report",
    "exporters": "core.exporters",
    "accounting": "core.accounting",
    "reuse": "core.reuse",
    "guard": "runtime.guard",
    "check": "runtime.check",
    "custom": "runtime.custom",
    "sources": "runtime.sources",
    "hf": "runtime.hf",
    "retention": "runtime.retention",
    "ranks": "runtime.ranks",
    "autorun": "runtime.autorun",
    "sweep": "runtime.sweep",
    "paged": "runtime.paged",
    "engines": "runtime.engines",
    "pytest_plugin": "runtime.pytest_plugin",
    "oom": "ops.oom",
    "k8s": "ops.k8s",
    "audit": "isolation",
}


def new_name(old: str) -> str | None:
    """``kvguardian.ledger.records`` -> ``kvguardian.core.ledger.records``; None when ``old`` did not move."""
    parts = old.split(".")
    if len(parts) < 2 or parts[0] != "kvguardian" or parts[1] not in MOVED:
        return None
    return ".".join(["kvguardian", MOVED[parts[1]], *parts[2:]])


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new path's, already executed."""


class MovedFinder(importlib.abc.MetaPathFinder):
    """Resolves an old path to the module at its new path (the same object, so `isinstance` keeps working)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        target_name = new_name(fullname)
        if target_name is None:
            return None
        warnings.warn(f"{fullname} moved to {target_name}; import it from there (the old path goes after the next "
                      "release)", DeprecationWarning, stacklevel=2)
        return importlib.machinery.ModuleSpec(fullname, _Alias(target_name))


def install() -> None:
    """Add the finder once, first: an old submodule path (``kvguardian.ledger.records``) would otherwise be found
    by the path finder in the aliased package's folder and loaded a second time, as another module object."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
