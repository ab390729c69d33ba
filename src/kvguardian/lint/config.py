"""Lint configuration: ``[tool.kv-guardian.lint]`` in ``pyproject.toml``, then the command line on top.

    [tool.kv-guardian.lint]
    select = ["KVG4"]                 # ids or prefixes; default: every lint rule
    ignore = ["KVG403"]
    exclude = ["tests/fixtures/*"]    # glob patterns, matched against paths and their parts
    per-file-ignores = { "scripts/*" = ["KVG401"] }

The file is the nearest ``pyproject.toml`` above the working directory that has the table, or
``--config FILE``. A wrong key or value is a usage error (exit 2) naming the key and the file.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvguardian.core.errors import UsageError

__all__ = ["DEFAULT_EXCLUDE", "LintConfig", "find_pyproject", "load_config"]

#: Directories never descended into unless named on the command line.
DEFAULT_EXCLUDE = (".git", ".hg", ".svn", ".venv", ".venv-*", "venv", "__pycache__", "node_modules",
                   ".mypy_cache", ".ruff_cache", ".pytest_cache", ".tox", ".nox", "build", "dist", "*.egg-info")

_KEYS = {"select", "ignore", "exclude", "extend-exclude", "per-file-ignores"}


@dataclass(frozen=True)
class LintConfig:
    """Which rules run where. Selectors are ids (``KVG401``) or prefixes (``KVG4``, ``KVG40``) or ``ALL``."""

    select: tuple[str, ...] = ("ALL",)
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    source: str = ""  # the file it came from, for messages

    def with_cli(self, select: Sequence[str] | None, ignore: Sequence[str] | None,
                 extend_exclude: Sequence[str] | None = None) -> LintConfig:
        """Command-line ``--select`` replaces the file's selection; ``--ignore`` adds to it."""
        cfg = self
        if select:
            cfg = replace(cfg, select=tuple(select))
        if ignore:
            cfg = replace(cfg, ignore=cfg.ignore + tuple(ignore))
        if extend_exclude:
            cfg = replace(cfg, exclude=cfg.exclude + tuple(extend_exclude))
        return cfg

    def enabled(self, known: Iterable[str]) -> frozenset[str]:
        """The rule ids that run, after checking every selector names at least one known rule.

        Raises:
            UsageError: a selector matches no rule.
        """
        ids = sorted(known)
        for sel in (*self.select, *self.ignore, *(s for _, sels in self.per_file_ignores for s in sels)):
            if sel != "ALL" and not any(i.startswith(sel) for i in ids):
                where = f" (in {self.source})" if self.source else ""
                raise UsageError(f"unknown rule selector {sel!r}{where}; lint rules are {', '.join(ids)}")
        chosen = {i for i in ids if any(sel == "ALL" or i.startswith(sel) for sel in self.select)}
        return frozenset(i for i in chosen if not any(sel == "ALL" or i.startswith(sel) for sel in self.ignore))

    def ignored_for(self, path: str) -> tuple[str, ...]:
        """Selectors that per-file-ignores turn off for ``path``."""
        out: list[str] = []
        for pattern, sels in self.per_file_ignores:
            if _matches(path, pattern):
                out.extend(sels)
        return tuple(out)

    def is_excluded(self, path: str) -> bool:
        return any(_matches(path, pattern) for pattern in self.exclude)


def _matches(path: str, pattern: str) -> bool:
    """A glob matches the whole path, its tail, or any single part (``build`` excludes ``a/build/x.py``)."""
    p = path.replace("\\", "/")
    while p.startswith("./"):
        p = p[2:]
    if fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, f"*/{pattern}"):
        return True
    return "/" not in pattern and any(fnmatch.fnmatch(part, pattern) for part in p.split("/"))


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` holding ``[tool.kv-guardian.lint]``."""
    for d in (start, *start.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file() and "kv-guardian" in candidate.read_text(encoding="utf-8", errors="replace"):
            data = _read_toml(candidate)
            if isinstance(data.get("tool", {}).get("kv-guardian", {}).get("lint"), dict):
                return candidate
    return None


def load_config(path: Path | None = None, *, start: Path | None = None) -> LintConfig:
    """The configuration in ``path`` (or found from ``start``), or the defaults.

    Raises:
        UsageError: the file cannot be read or parsed, or holds an unknown key or a wrong value.
    """
    if path is None:
        path = find_pyproject(start or Path.cwd())
        if path is None:
            return LintConfig()
    if not path.is_file():
        raise UsageError(f"config file {str(path)!r} does not exist; pass a pyproject.toml with --config")
    data = _read_toml(path)
    table = data.get("tool", {}).get("kv-guardian", {}).get("lint", {})
    return _from_table(table, str(path))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise UsageError("reading pyproject.toml on Python 3.10 needs 'tomli'; fix: pip install tomli") from None
    try:
        with path.open("rb") as fh:
            return dict(tomllib.load(fh))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {str(path)!r}: {exc}; fix the TOML or pass another file with --config") from None


def _from_table(table: Mapping[str, Any], source: str) -> LintConfig:
    unknown = set(table) - _KEYS
    if unknown:
        raise UsageError(f"unknown key(s) {', '.join(sorted(unknown))} in [tool.kv-guardian.lint] of {source}; "
                         f"known keys: {', '.join(sorted(_KEYS))}")
    select = _strings(table, "select", source) or ("ALL",)
    exclude = _strings(table, "exclude", source) or DEFAULT_EXCLUDE
    exclude = exclude + _strings(table, "extend-exclude", source)
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise UsageError(f"per-file-ignores in {source} must be a table of glob = [ids]")
    per_file = tuple((str(k), _strings(pfi, k, source)) for k in pfi)
    return LintConfig(select=select, ignore=_strings(table, "ignore", source), exclude=exclude,
                      per_file_ignores=per_file, source=source)


def _strings(table: Mapping[str, Any], key: str, source: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{key} in [tool.kv-guardian.lint] of {source} must be a list of strings")
    return tuple(value)
