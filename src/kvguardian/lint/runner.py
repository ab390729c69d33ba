"""Lint files: discover, read, parse with the language's front end, run the enabled rules, apply noqa and
per-file ignores. Nothing a file contains stops the run: what cannot be linted becomes a `Skipped` line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kvguardian.lint.config import LintConfig
from kvguardian.lint.diagnostic import Diagnostic, LintResult, Skipped
from kvguardian.lint.files import SourceFile, discover, read_source
from kvguardian.lint.noqa import parse_noqa, silenced
from kvguardian.lint.python import index_python
from kvguardian.lint.rules import RULES, Hit, Rule

__all__ = ["lint_paths", "lint_source"]


def lint_source(src: SourceFile, rules: Iterable[Rule]) -> list[tuple[str, Hit]] | Skipped:
    """Run ``rules`` on one source file's text."""
    if src.language == "python":
        return _lint_python(src.path, src.text, [r for r in rules if r.language == "python"])
    from kvguardian.lint.treesitter import lint_tree_sitter

    return lint_tree_sitter(src.path, src.language, src.text, [r.id for r in rules])


def _lint_python(path: str, text: str, rules: list[Rule]) -> list[tuple[str, Hit]] | Skipped:
    ix = index_python(path, text)
    if isinstance(ix, Skipped):
        return ix
    try:
        return [(rule.id, h) for rule in rules for h in rule.check(ix)]
    except RecursionError:
        return Skipped(path, "nested too deeply to analyse; skipped")


def lint_paths(paths: list[str], config: LintConfig | None = None,
               on_skip: Callable[[Skipped], None] | None = None) -> LintResult:
    """Lint every file under ``paths``. ``on_skip`` sees each skipped file as it happens (for streaming)."""
    config = config or LintConfig()
    enabled = config.enabled(RULES)
    result = LintResult()
    for item in discover(paths, config):
        if isinstance(item, Skipped):
            _skip(result, item, on_skip)
            continue
        src = read_source(item)
        if isinstance(src, Skipped):
            _skip(result, src, on_skip)
            continue
        allowed = _file_rules(config, item, enabled) if config.per_file_ignores else enabled
        rules = [RULES[i] for i in sorted(allowed)]
        hits = lint_source(src, rules)
        if isinstance(hits, Skipped):
            _skip(result, hits, on_skip)
            continue
        result.files += 1
        result.lines += src.text.count("\n") + (not src.text.endswith("\n") and bool(src.text))
        noqa = parse_noqa(src.text) if hits else {}
        for rule_id, h in hits:
            if silenced(noqa, rule_id, h.line, h.end_line):
                result.suppressed += 1
                continue
            result.diagnostics.append(Diagnostic(item, h.line, h.col, rule_id, h.message, h.end_line, h.end_col))
    result.diagnostics.sort()
    return result


def _file_rules(config: LintConfig, path: str, enabled: frozenset[str]) -> frozenset[str]:
    sels = config.ignored_for(path)
    return frozenset(i for i in enabled if not any(sel == "ALL" or i.startswith(sel) for sel in sels))


def _skip(result: LintResult, item: Skipped, on_skip: Callable[[Skipped], None] | None) -> None:
    result.skipped.append(item)
    if on_skip is not None:
        on_skip(item)
