"""Go, Java and Kotlin front end: tree-sitter parses, `languages` reduces each function to calls and
assignments, `redis` runs KVG405 on them; `closures` runs KVG406 on Go and Java trees. Needs
``pip install 'kv-guardian[lint]'``.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvguardian.lint.diagnostic import Skipped
from kvguardian.lint.rules.base import Hit

__all__ = ["lint_tree_sitter"]

_NAMES = {"go": "Go", "java": "Java", "kotlin": "Kotlin"}


def lint_tree_sitter(path: str, language: str, text: str, rule_ids: Iterable[str]) -> list[tuple[str, Hit]] | Skipped:
    """KVG405 and KVG406 hits in one Go/Java/Kotlin file, or a `Skipped` (grammar missing, syntax error)."""
    ids = set(rule_ids) & {"KVG405", "KVG406"}
    if not ids:
        return []
    from kvguardian.lint.treesitter.closures import check_closures
    from kvguardian.lint.treesitter.languages import first_error_line, functions, imports, parser_for
    from kvguardian.lint.treesitter.redis import check_function, uses_redis

    try:
        parser = parser_for(language)
    except ImportError:
        return Skipped(path, f"{_NAMES[language]} needs the tree-sitter grammars; fix: pip install 'kv-guardian[lint]'")
    tree = parser.parse(text.encode("utf-8"))
    bad = first_error_line(tree.root_node)
    if bad:
        return Skipped(path, f"does not parse as {_NAMES[language]} (syntax error at line {bad}); skipped", line=bad)
    hits: list[tuple[str, Hit]] = []
    if "KVG405" in ids:
        client = uses_redis(imports(tree.root_node))
        hits += [("KVG405", h) for facts in functions(language, tree.root_node)
                 for h in check_function(language, facts, client)]
    if "KVG406" in ids and language in ("go", "java"):
        hits += [("KVG406", h) for h in check_closures(language, tree.root_node)]
    return hits
