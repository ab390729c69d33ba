"""Each rule fires exactly on the lines its fixtures mark ``# expect: KVG4xx`` and nowhere else.

Fixtures live in tests/fixtures/lint/: ``kvg40N_*.py`` hold the anti-pattern in the shapes real code has,
``*_clean.py`` the near misses that must stay silent; Go, Java and Kotlin fixtures exercise KVG405 through
tree-sitter.
"""

import re
from pathlib import Path

import pytest

from kvguardian.core.findings import CATALOG
from kvguardian.lint import LintConfig, lint_paths
from kvguardian.lint.rules import RULES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lint"
_EXPECT = re.compile(r"(?://|#)\s*expect:\s*(KVG\d{3}(?:\s*,\s*KVG\d{3})*)")
SOURCES = sorted(p for p in FIXTURES.iterdir() if p.suffix in (".py", ".go", ".java", ".kt")
                 and "syntax_error" not in p.name and "latin1" not in p.name)


def _expected(path: Path) -> set[tuple[str, int]]:
    out = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _EXPECT.search(line)
        if m:
            out.update((rid.strip(), lineno) for rid in m.group(1).split(","))
    return out


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_rules_fire_exactly_on_marked_lines(path):
    if path.suffix != ".py":
        pytest.importorskip("tree_sitter", reason="Go/Java/Kotlin need kv-guardian[lint]")
    result = lint_paths([str(path)], LintConfig())
    assert not result.skipped, result.skipped
    got = {(d.rule, d.line) for d in result.diagnostics}
    assert got == _expected(path)


def test_every_rule_has_a_firing_fixture_and_a_clean_one():
    fired = set()
    for p in SOURCES:
        fired.update(rid for rid, _ in _expected(p))
    assert fired == set(RULES)
    for rid in RULES:
        assert any(p.name.startswith(rid.lower()) and "clean" in p.name for p in SOURCES), rid


def test_rule_docs_name_the_anti_pattern_the_fix_and_false_positives():
    for rid, rule in RULES.items():
        assert rule.doc.startswith(f"{rid} {CATALOG[rid].name}:"), rid
        assert "Fix:" in rule.doc and "False positives" in rule.doc and "Fires" in rule.doc, rid
        assert CATALOG[rid].id == rid


def test_select_ignore_and_prefixes():
    path = str(FIXTURES / "kvg402_global_store.py")
    only = lint_paths([path], LintConfig(select=("KVG402",)))
    assert {d.rule for d in only.diagnostics} == {"KVG402"}
    rest = lint_paths([path], LintConfig(ignore=("KVG402",)))
    assert {d.rule for d in rest.diagnostics} == {"KVG407"}
    assert {d.rule for d in lint_paths([path], LintConfig(select=("KVG40",))).diagnostics} == {"KVG402", "KVG407"}


def test_noqa_specific_bare_and_wrong_id():
    result = lint_paths([str(FIXTURES / "noqa_cases.py")], LintConfig())
    assert [(d.rule, d.line) for d in result.diagnostics] == [("KVG405", 12)]
    assert result.suppressed == 2
