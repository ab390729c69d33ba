"""Option groups that several commands share, each written once (``--web-config`` is in `web_options`).

The command line's flag vocabulary (``tests/unit/cli/test_cli_conventions.py`` checks it on every parser):

* ``-o/--output FILE`` is always a command's main output (`add_output`), never an input.
* A command that prints its result in more than one form has ``--format {text,json,...}`` (default text), and
  ``--json`` is short for ``--format json`` (`add_format`): code reads ``args.format``.
* A listener binds ``--host``/``--port``; a second one takes a prefix (``--exporter-host``/``--exporter-port``).
* A renamed flag stays one release as a hidden alias (`add_hidden_alias`), not shown by ``--help``.
* Every (sub)command's ``--help`` ends with an example that runs it (`example`).
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["add_duration_option", "add_format", "add_hidden_alias", "add_output", "add_subcommands", "example"]


def example(*commands: str) -> str:
    """The epilog of a (sub)command's ``--help``: ``example: COMMAND``, or ``examples:`` and one command a line.
    Each is a whole command line (``kv-guardian redis scan redis://127.0.0.1:6379 --json``), kept on one line."""
    if len(commands) == 1:
        return f"example: {commands[0]}"
    return "\n".join(["examples:", *(f"  {command}" for command in commands)])


def exit_codes(codes: Sequence[tuple[str, str]]) -> str:
    """The ``exit codes:`` paragraph of a command's ``--help`` (a module's ``EXITS``: code, meaning), before its
    example, each meaning wrapped to 80 columns under itself; empty when the command has none to list."""
    if not codes:
        return ""
    width = max(len(code) for code, _ in codes)
    lines = ["exit codes:"]
    for code, meaning in codes:
        wrapped = textwrap.wrap(meaning, 80 - width - 4) or [""]
        lines.append(f"  {code:<{width}}  {wrapped[0]}")
        lines += [" " * (width + 4) + more for more in wrapped[1:]]
    return "\n".join(lines)


def add_subcommands(p: argparse.ArgumentParser, dest: str, metavar: str) -> Any:
    """A required subcommand under ``p`` (``kv-guardian redis SUBCOMMAND``); its parsers are of ``p``'s class, so
    a bad word is the same one-line usage error as at the top level."""
    sub = p.add_subparsers(dest=dest, metavar=metavar, parser_class=type(p))
    sub.required = True
    return sub


def add_duration_option(p: argparse.ArgumentParser) -> None:
    """``--duration S`` of a command that serves until stopped."""
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")


def add_output(p: argparse.ArgumentParser, help_text: str, convert: Callable[[str], Any] = str) -> None:
    """``-o/--output FILE``: where the command writes its main result (``args.output``, None when not given)."""
    p.add_argument("-o", "--output", metavar="FILE", type=convert, help=help_text)


def add_format(p: argparse.ArgumentParser, json_help: str, formats: Sequence[str] = ("text", "json"),
               help_text: str = "output format (default text; --json is short for --format json)") -> None:
    """``--format {text,json,...}`` (default text) and ``--json``, short for ``--format json``: both set
    ``args.format``."""
    p.add_argument("--format", choices=list(formats), default="text", help=help_text)
    p.add_argument("--json", dest="format", action="store_const", const="json", default="text", help=json_help)


def add_hidden_alias(p: argparse.ArgumentParser, flag: str, dest: str, metavar: str | None = None) -> None:
    """``flag``, the old spelling of a renamed option writing ``dest``: still accepted for one release, not shown
    in ``--help``. Add it after the new option, whose default counts."""
    p.add_argument(flag, dest=dest, metavar=metavar, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
