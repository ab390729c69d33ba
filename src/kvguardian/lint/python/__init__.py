"""The Python front end: parse once, index once (`build_index`), run the selected rules on the index."""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterable

from kvguardian.lint.diagnostic import Skipped
from kvguardian.lint.python.index import ModuleIndex, build_index
from kvguardian.lint.rules.base import Hit, Rule

__all__ = ["ModuleIndex", "build_index", "lint_python"]


def lint_python(path: str, text: str, rules: Iterable[Rule]) -> list[tuple[str, Hit]] | Skipped:
    """(rule id, hit) for every rule that fires, or a `Skipped` when the source does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for odd escapes in the code we read
            tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        msg = (exc.msg or "invalid syntax").replace("\n", " ")
        return Skipped(path, f"does not parse as Python ({msg} at line {exc.lineno}); skipped", line=exc.lineno or 0)
    except RecursionError:
        return Skipped(path, "nested too deeply to parse; skipped")
    except (ValueError, MemoryError) as exc:
        return Skipped(path, f"cannot be parsed ({type(exc).__name__}: {exc}); skipped")
    try:
        ix = build_index(tree)
        return [(rule.id, h) for rule in rules for h in rule.check(ix)]
    except RecursionError:
        return Skipped(path, "nested too deeply to analyse; skipped")
