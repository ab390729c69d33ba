"""``--help`` shows the way in: every (sub)command ends with an example that runs it (and parses), and
``kv-guardian --help`` lists the commands by who runs them (`kvguardian.apps.cli.GROUPS`)."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from kvguardian.apps.cli import COMMANDS, EXAMPLE, GROUPS, build_parser, main
from kvguardian.apps.cli import all_parsers as cli_parsers


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(prog, parser) of the top level and of every (sub)command under it."""
    return [(p.prog, p) for _, p in cli_parsers()]


PARSERS = all_parsers()


def examples(help_text: str) -> list[str]:
    """The command lines under ``example:`` / ``examples:`` at the end of a help text."""
    found = re.search(r"^example: (.+)$", help_text, re.M)
    if found:
        return [found.group(1)]
    block = re.search(r"^examples:\n((?:  .+\n?)+)", help_text, re.M)
    return [line.strip() for line in block.group(1).splitlines()] if block else []


@pytest.mark.parametrize("prog, parser", PARSERS, ids=[prog for prog, _ in PARSERS])
def test_every_help_ends_with_an_example_of_its_own_command(prog, parser, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # a narrow terminal must not wrap an example line
    found = examples(parser.format_help())
    assert found, f"{prog} --help has no 'example:' line"
    for line in found:
        assert line == prog or line.startswith(prog + " "), f"{prog}: the example runs another command: {line}"
        words = shlex.split(line)
        try:
            build_parser().parse_args(words[1:])  # the example is a valid command line
        except SystemExit as exc:
            pytest.fail(f"{prog}: its example does not parse ({exc.code}): {line}")


def test_top_level_help_lists_the_commands_in_four_groups(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert len(GROUPS) == 4
    assert [word for title in GROUPS for word in ("app", "server", "Redis", "platform") if word in title] == [
        "app", "server", "Redis", "platform"]
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(COMMANDS), "every command in exactly one group"

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    sections = re.findall(r"^commands (.+):\n((?:  .*\n|\s{3,}.*\n)+)", text, re.M)
    assert [title for title, _ in sections] == list(GROUPS)
    for (title, body), names in zip(sections, GROUPS.values()):
        listed = re.findall(r"^  (\S+)", body, re.M)
        assert listed == list(names), title
    assert examples(text) == [EXAMPLE]


def test_no_command_prints_the_grouped_help(capsys):
    assert main([]) == 2
    assert "commands for Redis:" in capsys.readouterr().out


def test_one_command_s_parser_imports_no_other_command():
    parser = build_parser("lint")  # what `kv-guardian lint ...` builds: the table (every module) is not made
    assert parser.epilog is None
    assert "lint" in parser.parse_args(["lint", "x.py"]).command


@pytest.mark.parametrize("name", ["run", "oom-guard"])
def test_a_command_s_exit_codes_are_in_its_help_before_the_example(name, monkeypatch):
    """A CI job or a Kubernetes probe branches on them, so ``--help`` (and the generated CLI reference) lists
    each, kept as laid out at 80 columns."""
    import importlib

    monkeypatch.setenv("COLUMNS", "80")
    module = importlib.import_module(COMMANDS[name])
    [text] = [parser.format_help() for prog, parser in all_parsers() if prog == f"kv-guardian {name}"]
    block = text[text.index("exit codes:\n"):text.index("example: ")]
    assert max(len(line) for line in block.splitlines()) <= 80, block
    words = " ".join(block.split())  # a long meaning is wrapped under itself
    for code, meaning in module.EXITS:
        assert f" {code} {' '.join(meaning.split())}" in words, (code, block)
