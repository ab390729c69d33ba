"""The ``kv-guardian`` command line: one module per command, kept apart from reporters.

Every command module has ``NAME``, ``HELP``, ``EXAMPLE`` (one command line, shown under its ``--help``),
``add_arguments(parser)`` and ``run(args) -> int``, and may list its ``EXITS`` (code, meaning) for its ``--help``;
`GROUPS` sorts the commands by who runs them for ``kv-guardian --help``. `main` turns kv-guardian's own errors into
one line on stderr and an exit code; a traceback is shown only for a bug, and only with ``KVG_DEBUG=1``. Every line
it writes is escaped and masked (`kvguardian.core.report.escape`), and the ``kvguardian`` logger's warnings appear
on stderr as one line each.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import io
import logging
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from kvguardian import __version__
from kvguardian.apps.cli.options import example, exit_codes
from kvguardian.core.errors import EXIT_ENVIRONMENT, EXIT_INTERNAL, EXIT_USAGE, KVGuardianError
from kvguardian.core.report.escape import visible

__all__ = ["ALIASES", "COMMANDS", "EXAMPLE", "GROUPS", "HelpFormatter", "all_parsers", "build_parser", "main"]

#: command name -> module. Add a line here to add a command.
COMMANDS: dict[str, str] = {
    "demo": "kvguardian.apps.cli.demo",
    "repro": "kvguardian.apps.cli.repro",
    "exporter": "kvguardian.apps.cli.exporter",
    "watch": "kvguardian.apps.cli.watch",
    "redis": "kvguardian.apps.cli.redis",
    "sweep": "kvguardian.apps.cli.sweep",
    "run": "kvguardian.apps.cli.run",
    "lint": "kvguardian.apps.cli.lint",
    "oom-guard": "kvguardian.apps.cli.oom_guard",
    "device-plugin": "kvguardian.apps.cli.device_plugin",
    "serve-mini": "kvguardian.apps.cli.serve_mini",
    "isolation": "kvguardian.apps.cli.isolation",
    "report": "kvguardian.apps.cli.report",
}

#: old command name -> its new name: still accepted for one release, absent from ``--help`` and the CLI reference
#: (see docs/glossary.md for why each was renamed).
ALIASES: dict[str, str] = {"audit": "isolation"}

#: ``kv-guardian --help`` lists the commands under these headings, by who runs them; each command is in one.
GROUPS: dict[str, tuple[str, ...]] = {
    "for your app (Hugging Face transformers, PyTorch)": ("run", "lint", "report", "sweep", "demo", "repro"),
    "for a server (vLLM, SGLang, OpenAI-compatible)": ("watch", "isolation", "serve-mini"),
    "for Redis": ("redis",),
    "for the platform (Prometheus, Kubernetes)": ("exporter", "oom-guard", "device-plugin"),
}

#: The example under ``kv-guardian --help``.
EXAMPLE = "kv-guardian demo"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a paragraph whose lines are laid out already is kept as written: the
    command table of ``kv-guardian --help`` and each command's ``example:`` lines (`options.example`), so an
    example stays one line to copy. Any other paragraph is filled to the terminal's width as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if lines and (lines[0].startswith("example") or any(line.startswith("  ") for line in lines)):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(super()._fill_text(paragraph, width, indent))
        return "\n\n".join(paragraphs)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: what, where, and the fix (``--help``); help text through
    `HelpFormatter`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(visible(f"{self.prog}: error: {message}; see '{self.prog} --help'") + "\n")
        raise SystemExit(EXIT_USAGE)


class _OneLine(logging.Formatter):
    """A log record as one escaped line; its traceback only when debugging (``KVG_DEBUG=1``)."""

    def format(self, record: logging.LogRecord) -> str:
        line = visible(f"kv-guardian: {record.levelname.lower()}: {record.getMessage()}")
        if record.exc_info and os.environ.get("KVG_DEBUG"):
            line += "\n" + self.formatException(record.exc_info)
        return line


def _log_to_stderr() -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    handler.setLevel(logging.DEBUG if os.environ.get("KVG_DEBUG") else logging.WARNING)
    logger = logging.getLogger("kvguardian")
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > handler.level:
        logger.setLevel(handler.level)
    return handler


def build_parser(only: str | None = None) -> ArgumentParser:
    """The whole command line; ``only``: just that command's subparser (the other command modules are not
    imported: a command starts in less time)."""
    parser = ArgumentParser(
        prog="kv-guardian",
        usage="%(prog)s [-h] [--version] COMMAND ...",
        description="Find, prove and prevent KV-cache leaks in LLM inference and key-space leaks in Redis.",
    )
    parser.add_argument("--version", action="version", version=f"kv-guardian {__version__}")
    # The commands are listed by group in the epilog, not by argparse (which has one flat list of them).
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser,
                                help=argparse.SUPPRESS, prog=parser.prog)  # prog: not the usage= line
    helps: dict[str, str] = {}
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        helps[name] = module.HELP
        old_names = [old for old, new in ALIASES.items() if new == name]  # argparse lists aliases nowhere in help
        epilog = "\n\n".join(filter(None, [exit_codes(getattr(module, "EXITS", ())), example(module.EXAMPLE)]))
        p = sub.add_parser(name, description=module.HELP, epilog=epilog, aliases=old_names)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    if only is None:
        parser.epilog = _command_table(helps)
    return parser


def _command_table(helps: dict[str, str]) -> str:
    """The commands under their `GROUPS` headings, each with its one-line help, then the example."""
    width = max(shutil.get_terminal_size().columns - 2, 60)  # the width argparse fills to
    pad = max(map(len, helps)) + 4
    lines = []
    for title, names in GROUPS.items():
        lines.append(f"commands {title}:")
        for name in names:
            lines += textwrap.wrap(helps[name], width, initial_indent=f"  {name:<{pad - 2}}",
                                   subsequent_indent=" " * pad)
        lines.append("")
    lines += [example(EXAMPLE), "", "'kv-guardian COMMAND --help' shows a command's options and an example."]
    return "\n".join(lines)


def all_parsers(parser: argparse.ArgumentParser | None = None) -> Iterator[tuple[int, argparse.ArgumentParser]]:
    """(depth, parser) of ``parser`` (default: the whole command line) and of every (sub)command under it, in
    the order of ``--help`` (the docs' CLI reference and the convention tests walk it)."""

    def walk(p: argparse.ArgumentParser, depth: int) -> Iterator[tuple[int, argparse.ArgumentParser]]:
        yield depth, p
        for action in p._actions:  # noqa: SLF001 - argparse has no public way to list subcommands
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                # a hidden alias (`ALIASES`) maps to its command's very parser: each parser once
                for sub in {id(sub): sub for sub in action.choices.values()}.values():
                    yield from walk(sub, depth + 1)

    return walk(build_parser() if parser is None else parser, 0)


def main(argv: Sequence[str] | None = None) -> int:
    _stand_in_for_closed_streams()
    words = list(sys.argv[1:] if argv is None else argv)
    first = ALIASES.get(words[0], words[0]) if words else None
    parser = build_parser(first if first in COMMANDS else None)
    args = parser.parse_args(words)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help()
        return EXIT_USAGE
    handler = _log_to_stderr()
    try:
        return _run(run, args)
    finally:
        logging.getLogger("kvguardian").removeHandler(handler)


_WRITE_ERRORS = (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EBADF)


class _ClosedStdout(io.TextIOBase):
    """Stands in for a stdout the command was started without (``>&-``): writing to it is the write error
    (EBADF) that `_run` turns into one line and exit code 3, as for a full disk."""

    def write(self, _text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")


def _stand_in_for_closed_streams() -> None:
    """Started with stdout or stderr closed, Python sets them to None and every write was an AttributeError
    (rc 70; ``run`` lost the program's exit code). stderr becomes os.devnull (its lines have nowhere to go;
    the exit code still tells), stdout `_ClosedStdout`. Nothing here opens a descriptor a program under
    ``run`` could inherit (os.devnull's is not inheritable)."""
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    if sys.stderr is None:
        try:
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - replaces the stream until exit
        except OSError:
            pass


_LINE_MAX = 2000  # characters of one error line


def _run(run: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        if len(text) > _LINE_MAX:  # a message quoting a huge value from a file: the line, not the value
            text = f"{text[:_LINE_MAX]}…(+{len(text) - _LINE_MAX:,} characters)"
        try:
            sys.stderr.write(visible(f"kv-guardian {args.command}: {text}") + "\n")
        except (OSError, ValueError):  # stderr full or gone: the exit code still says what happened
            pass

    try:
        code = int(run(args) or 0)
        sys.stdout.flush()  # a full disk shows here, not at interpreter exit
        return code
    except KVGuardianError as exc:
        say(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except BrokenPipeError:  # e.g. piped into head
        _quiet_stdout()
        return 0
    except OSError as exc:
        if exc.errno not in _WRITE_ERRORS:
            return _internal(exc, say)
        _quiet_stdout()
        fix = "give the command a stdout" if exc.errno == errno.EBADF else "free space"
        say(f"error: cannot write the output: {exc.strerror or exc}; fix: {fix} or write elsewhere (-o FILE)")
        return EXIT_ENVIRONMENT
    except Exception as exc:
        return _internal(exc, say)


def _internal(exc: Exception, say: Callable[[str], None]) -> int:
    """A bug: one line, the traceback only on request."""
    if os.environ.get("KVG_DEBUG"):
        raise exc
    say(f"internal error: {type(exc).__name__}: {exc} "
        "(this is a bug in kv-guardian; rerun with KVG_DEBUG=1 for the traceback)")
    return EXIT_INTERNAL


def _quiet_stdout() -> None:
    """Drop what stdout still buffers, so the interpreter's exit does not fail on it again."""
    try:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces stdout until exit
    except OSError:
        pass


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
