"""One meaning per word (docs/glossary.md): no module, public name, (sub)command or visible flag uses a
glossary word for a meaning the glossary excludes, and every old spelling kept for one release still works
while staying out of ``--help``.

Names come from the source tree (module paths, and through the AST the public classes, functions and methods of
every module), so nothing heavy is imported; the command line from `kvguardian.apps.cli.all_parsers`.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import warnings
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from kvguardian.apps.cli import ALIASES, COMMANDS, all_parsers, build_parser
from kvguardian.runtime.guard import Guard

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "kvguardian"
GLOSSARY = ROOT / "docs" / "glossary.md"

#: word -> patterns a qualified name (``kvguardian.lint.engine``, ``kvguardian.runtime.guard.Guard.attach``) or a
#: command-line name (``cli:kv-guardian redis scan``, ``cli:kv-guardian run --report``) must not match: the
#: meanings the glossary excludes.
BANNED: dict[str, list[str]] = {
    "audit": [
        r"^kvguardian\.isolation\..*audit",  # the isolation wing probes; it audits no owner table
        r"^kvguardian\.runtime\.guard\.Guard\.\w*audit",  # attaching is not auditing
        r"^cli:kv-guardian audit\b",  # the probe's command is `isolation`
    ],
    "engine": [
        r"^kvguardian\.(core|lint|keyspace|isolation|triton)\..*engine",  # only inference engines are engines
        r"^cli:kv-guardian (lint|redis|isolation)\b.*engine",
    ],
    "report": [
        r"^cli:kv-guardian (?!exporter\b).* --report$",  # outside `exporter` (an input), outputs are -o/--output
    ],
    "sweep": [
        r"^kvguardian\.keyspace\..*sweep",  # a Redis key-space pass is a scan
        r"^cli:kv-guardian redis\b.*sweep",
    ],
}

#: names the banned patterns match that stay for one release, each with the new name it warns about or aliases
DEPRECATED: dict[str, str] = {
    "kvguardian.runtime.guard.Guard.audit_process": "attach_process",
    "kvguardian.runtime.guard.Guard.stop_auditing_process": "detach_process",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _public_names(module: str, tree: ast.Module) -> list[str]:
    """The module's public top-level classes and functions, and the public methods of its public classes."""
    names = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            names.append(f"{module}.{node.name}")
            if isinstance(node, ast.ClassDef):
                names += [f"{module}.{node.name}.{item.name}" for item in node.body
                          if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.name.startswith("_")]
    return names


def code_names() -> list[str]:
    """Every module's dotted name and the public names in it."""
    names = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        names += [module, *_public_names(module, ast.parse(path.read_text(encoding="utf-8")))]
    return names


def _visible(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS


def cli_names() -> list[str]:
    """``cli:PROG`` of every (sub)command, and ``cli:PROG FLAG`` of every flag ``--help`` shows."""
    names = []
    for _, parser in all_parsers():
        names.append(f"cli:{parser.prog}")
        names += [f"cli:{parser.prog} {flag}" for action in parser._actions if _visible(action)
                  for flag in action.option_strings]
    return names


def violations(names: list[str]) -> list[str]:
    return [f"{name} uses {word!r} as the glossary excludes ({pattern})" for word, patterns in BANNED.items()
            for pattern in patterns for name in names
            if re.search(pattern, name, re.IGNORECASE) and name not in DEPRECATED]


def test_the_glossary_page_defines_every_checked_word():
    text = GLOSSARY.read_text(encoding="utf-8")
    headings = set(re.findall(r"^## (\w+)$", text, re.MULTILINE))
    assert set(BANNED) <= headings, f"docs/glossary.md lacks a section for {sorted(set(BANNED) - headings)}"
    for old, new in ALIASES.items():  # every alias and deprecated name is written down where readers look
        assert f"kv-guardian {old} " in text and f"kv-guardian {new} " in text, (old, new)
    for old, new in DEPRECATED.items():
        assert old.rsplit(".", 1)[-1] in text and new in text, old
    assert "glossary.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "docs/glossary.md" in (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")


def test_no_module_or_public_name_uses_a_word_as_the_glossary_excludes():
    names = code_names()
    assert "kvguardian.keyspace.scan.scan" in names and "kvguardian.lint.runner" in names  # the walk sees names
    assert violations(names) == []


def test_no_command_or_visible_flag_uses_a_word_as_the_glossary_excludes():
    names = cli_names()
    assert "cli:kv-guardian isolation cache-sharing" in names and "cli:kv-guardian sweep" in names
    assert violations(names) == []


@pytest.mark.parametrize("name", ["kvguardian.lint.engine", "kvguardian.keyspace.sweep.SweepOptions",
                                  "kvguardian.isolation.cache_sharing.CacheSharingAudit",
                                  "cli:kv-guardian audit cache-sharing", "cli:kv-guardian lint --report"])
def test_each_old_meaning_is_caught(name):
    """The old names are what the patterns exist for: each would fail the walks above."""
    assert violations([name])


@pytest.mark.parametrize(("old", "new"), [("audit", "isolation")])
def test_a_renamed_command_parses_as_its_new_name_and_is_hidden(old, new):
    assert ALIASES[old] == new and new in COMMANDS and old not in COMMANDS
    argv = ["cache-sharing", "--url", "http://127.0.0.1:1", "--model", "m", "--key", "a", "--key", "b"]
    by_old, by_new = build_parser().parse_args([old, *argv]), build_parser().parse_args([new, *argv])
    assert by_old._run is by_new._run and vars(by_old) | {"command": new} == vars(by_new)
    help_out = io.StringIO()
    with redirect_stdout(help_out), pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert re.search(rf"\b{new}\b", help_out.getvalue()) and not re.search(rf"^\s+{old}\b", help_out.getvalue(),
                                                                            re.MULTILINE)
    assert all(not p.prog.startswith(f"kv-guardian {old}") for _, p in all_parsers())  # not in the CLI reference


def test_a_renamed_guard_method_warns_and_calls_the_new_one(monkeypatch):
    calls: list[object] = []
    monkeypatch.setattr(Guard, "attach_process", lambda self, *, generate=True: calls.append(generate) or self)
    monkeypatch.setattr(Guard, "detach_process", lambda self: calls.append("detach"))
    guard = Guard()
    with pytest.warns(DeprecationWarning, match=r"Guard\.audit_process is now Guard\.attach_process"):
        assert guard.audit_process(generate=False) is guard
    with pytest.warns(DeprecationWarning, match=r"Guard\.stop_auditing_process is now Guard\.detach_process"):
        guard.stop_auditing_process()
    assert calls == [False, "detach"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guard.detach_process()  # the new names do not warn
