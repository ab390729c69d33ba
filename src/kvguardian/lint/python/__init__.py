"""The Python front end: parse once, index once (`index_python`); `lint.runner` runs the selected rules on the
index."""

from __future__ import annotations

import ast
import warnings

from kvguardian.lint.diagnostic import Skipped
from kvguardian.lint.python.index import ModuleIndex, build_index

__all__ = ["ModuleIndex", "build_index", "index_python"]


def index_python(path: str, text: str) -> ModuleIndex | Skipped:
    """The index of one Python source, or a `Skipped` when it does not parse."""
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
        return build_index(tree)
    except RecursionError:
        return Skipped(path, "nested too deeply to analyse; skipped")
