"""The command line's flag vocabulary, one convention on every (sub)command (CONTRIBUTING.md, "Command-line
conventions"; `kvguardian.apps.cli.options`):

* ``-o`` is only ever the short form of ``--output``, and ``--output`` names a FILE written;
* no bind option is spelled ``--addr``/``--bind``/``--listen``: a listener is ``--host`` with ``--port``;
* ``--json`` is short for ``--format json`` (same dest, const ``json``), and ``--format`` defaults to text;
* the renamed spellings (``run --report``, ``redis exporter --addr``) still parse, hidden from ``--help``.
"""

from __future__ import annotations

import argparse
import re

import pytest

from kvguardian.apps.cli import all_parsers as cli_parsers
from kvguardian.apps.cli import build_parser
from kvguardian.apps.cli.options import add_format, add_hidden_alias, add_output

_FILE_METAVAR = re.compile(r"[A-Z_]*FILE|[A-Z]+\.[A-Za-z0-9]+")  # FILE, REPORT_FILE, OUT.json
_BIND_WORDS = {"--addr", "--bind", "--listen"}


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(prog, parser) of the top level and of every (sub)command under it."""
    return [(p.prog, p) for _, p in cli_parsers()]


def _visible(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS


def _output_problems(action: argparse.Action) -> list[str]:
    names = set(action.option_strings)
    if not names & {"-o", "--output"}:
        return []
    problems = []
    if names != {"-o", "--output"}:
        problems.append(f"-o and --output must be one option, -o/--output (found {sorted(names)})")
    if not isinstance(action.metavar, str) or not _FILE_METAVAR.fullmatch(action.metavar):
        problems.append(f"--output needs a FILE metavar (found {action.metavar!r})")
    return problems


def _format_problems(by_flag: dict[str, argparse.Action]) -> list[str]:
    problems = []
    fmt, js = by_flag.get("--format"), by_flag.get("--json")
    if fmt is not None and fmt.default != "text":
        problems.append(f"--format must default to text (found {fmt.default!r})")
    if js is None:
        return problems
    if fmt is None or "json" not in (fmt.choices or ()):
        problems.append("--json without --format {text,json,...}")
    if not (isinstance(js, argparse._StoreConstAction) and js.const == "json"
            and js.dest == (fmt.dest if fmt is not None else "format")):
        problems.append(f"--json must be short for --format json (dest {js.dest!r}, const {js.const!r})")
    return problems


def problems(p: argparse.ArgumentParser) -> list[str]:
    """How ``p``'s own options break the conventions (its subcommands are checked on their own)."""
    found: list[str] = []
    by_flag = {flag: a for a in p._actions for flag in a.option_strings}
    for action in p._actions:
        found += _output_problems(action)
        if _visible(action) and (bad := _BIND_WORDS & set(action.option_strings)):
            found.append(f"{sorted(bad)[0]} is a bind address: spell it --host (with --port)")
        if _visible(action) and "--host" in action.option_strings and "--port" not in by_flag:
            found.append("--host without --port")
    return found + _format_problems(by_flag)


@pytest.mark.parametrize("prog, parser", all_parsers(), ids=[prog for prog, _ in all_parsers()])
def test_every_parser_follows_the_conventions(prog, parser):
    assert problems(parser) == [], prog


def test_the_walk_sees_the_commands_it_checks():
    progs = {prog for prog, _ in all_parsers()}
    for name in ("run", "lint", "report", "redis scan", "redis rdb", "redis diff", "redis exporter", "exporter",
                 "demo", "sweep", "watch vllm", "isolation cache-sharing"):
        assert f"kv-guardian {name}" in progs


def _parser(*build) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bad", add_help=False)
    for step in build:
        step(p)
    return p


BAD = {
    "-o alone": (lambda p: p.add_argument("-o", metavar="FILE"), "one option"),
    "-o for an input": (lambda p: p.add_argument("-o", "--other", metavar="FILE"), "one option"),
    "--output without -o": (lambda p: p.add_argument("--output", metavar="FILE"), "one option"),
    "--output without a FILE": (lambda p: p.add_argument("-o", "--output", metavar="HTML"), "FILE metavar"),
    "--output without a metavar": (lambda p: p.add_argument("-o", "--output"), "FILE metavar"),
    "--addr": (lambda p: p.add_argument("--addr"), "--addr is a bind address"),
    "--bind": (lambda p: [p.add_argument("--bind"), p.add_argument("--port")], "--bind is a bind address"),
    "--listen": (lambda p: p.add_argument("--listen"), "--listen is a bind address"),
    "--host alone": (lambda p: p.add_argument("--host"), "--host without --port"),
    "--json alone": (lambda p: p.add_argument("--json", action="store_true"), "--json without --format"),
    "--json its own dest": (lambda p: [p.add_argument("--format", choices=["text", "json"], default="text"),
                                       p.add_argument("--json", action="store_true")], "short for --format json"),
    "--json another const": (lambda p: [p.add_argument("--format", choices=["text", "json"], default="text"),
                                        p.add_argument("--json", dest="format", action="store_const",
                                                       const="text")], "short for --format json"),
    "--format without json": (lambda p: [p.add_argument("--format", choices=["text", "csv"], default="text"),
                                         p.add_argument("--json", dest="format", action="store_const",
                                                        const="json")], "--json without --format"),
    "--format not text by default": (lambda p: p.add_argument("--format", choices=["text", "json"],
                                                              default="json"), "default to text"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_parser_that_breaks_a_convention_fails(name):
    build, fragment = BAD[name]
    found = problems(_parser(build))
    assert any(fragment in line for line in found), found


def test_the_helpers_make_a_parser_that_passes():
    p = _parser(lambda p: add_output(p, "write it to FILE"), lambda p: add_format(p, json_help="as JSON"),
                lambda p: p.add_argument("--host"), lambda p: p.add_argument("--port", type=int),
                lambda p: add_hidden_alias(p, "--addr", "host"))
    assert problems(p) == []
    assert p.parse_args(["--json"]).format == "json" and p.parse_args([]).format == "text"
    assert p.parse_args(["--json", "--format", "text"]).format == "text"  # the last one given wins
    assert p.parse_args(["--addr", "0.0.0.0"]).host == "0.0.0.0" and p.parse_args([]).host is None


def _sub(*path: str) -> argparse.ArgumentParser:
    return dict(all_parsers())[" ".join(["kv-guardian", *path])]


def test_run_report_is_a_hidden_alias_of_output():
    parser = build_parser()
    for flag in ("--report", "--output", "-o"):
        args = parser.parse_args(["run", flag, "r.json", "--", "python", "app.py"])
        assert args.output == "r.json" and args.program[-2:] == ["python", "app.py"], flag
    assert parser.parse_args(["run", "--", "python"]).output is None
    text = _sub("run").format_help()
    assert "--report" not in text and "-o FILE, --output FILE" in text


def test_redis_exporter_addr_is_a_hidden_alias_of_host():
    parser = build_parser()
    for flag in ("--addr", "--host"):
        assert parser.parse_args(["redis", "exporter", "redis://x", flag, "0.0.0.0"]).host == "0.0.0.0", flag
    assert parser.parse_args(["redis", "exporter", "redis://x"]).host == "127.0.0.1"
    text = _sub("redis", "exporter").format_help()
    assert "--addr" not in text and "--host HOST" in text


def test_exporter_report_stays_an_input():
    args = build_parser().parse_args(["exporter", "--report", "a.json", "--report", "b.json"])
    assert args.report == ["a.json", "b.json"]


@pytest.mark.parametrize("argv", [["demo"], ["sweep"], ["lint"], ["redis", "diff", "a", "b"],
                                  ["repro", "orphaned"], ["watch", "sglang", "--metrics", "http://x"]])
def test_json_is_short_for_format_json(argv):
    parser = build_parser()
    assert parser.parse_args(argv).format == "text"
    assert parser.parse_args([*argv, "--json"]).format == "json"
    assert parser.parse_args([*argv, "--format", "json"]).format == "json"
