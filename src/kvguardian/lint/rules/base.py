"""What a rule is: an id of the catalog, the languages it reads, and a check that yields `Hit`s."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Hit", "Rule", "hit"]


@dataclass(frozen=True)
class Hit:
    line: int  # 1-based
    col: int  # 1-based
    message: str
    end_line: int = 0
    end_col: int = 0


@dataclass(frozen=True)
class Rule:
    """``check`` takes a language front end's index (`ModuleIndex` for Python) and yields hits."""

    id: str
    language: str  # "python" or "tree-sitter" (Go, Java, Kotlin)
    check: Callable[[Any], Iterable[Hit]]
    doc: str  # the anti-pattern, the fix, the false positives: the rule module's docstring


def hit(node: ast.AST, message: str) -> Hit:
    line = getattr(node, "lineno", 1)
    return Hit(line, getattr(node, "col_offset", 0) + 1, message,
               getattr(node, "end_lineno", None) or line, (getattr(node, "end_col_offset", None) or 0) + 1)


def describe(node: ast.AST, limit: int = 60) -> str:
    """Source text of a small expression, cut to ``limit`` characters, for messages."""
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 1] + "…"
