"""Static checks (article §4.2): ``kv-guardian lint`` finds KV-leak anti-patterns in source code before they run.

Python through its AST (`kvguardian.lint.python`), Go, Java and Kotlin through tree-sitter
(`kvguardian.lint.treesitter`, extra ``lint``); one module per rule in `kvguardian.lint.rules`; configuration,
noqa comments, file discovery and output formats in their own modules.

    from kvguardian.lint import lint_paths
    result = lint_paths(["src/"])
    for d in result.diagnostics:
        print(d.path, d.line, d.rule, d.message)
"""

from __future__ import annotations

from kvguardian.lint.config import LintConfig, load_config
from kvguardian.lint.diagnostic import Diagnostic, LintResult, Skipped
from kvguardian.lint.rules import RULES
from kvguardian.lint.runner import lint_paths

__all__ = ["RULES", "Diagnostic", "LintConfig", "LintResult", "Skipped", "lint_paths", "load_config"]
