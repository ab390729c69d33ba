"""The ``kv-guardian`` command line: one module per command, kept apart from reporters.

Every command module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. `main`
turns kv-guardian's own errors into one line on stderr and an exit code; a traceback is shown only for a bug,
and only with ``KVG_DEBUG=1``. Every line it writes is escaped and masked (`kvguardian.report.escape`), and
the ``kvguardian`` logger's warnings appear on stderr as one line each.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import io
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from kvguardian import __version__
from kvguardian._errors import EXIT_ENVIRONMENT, EXIT_INTERNAL, EXIT_USAGE, KVGuardianError
from kvguardian.report.escape import visible

__all__ = ["COMMANDS", "build_parser", "main"]

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
    "audit": "kvguardian.apps.cli.audit",
    "report": "kvguardian.apps.cli.report",
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: what, where, and the fix (``--help``)."""

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
        description="Find, prove and prevent KV-cache leaks in LLM inference and key-space leaks in Redis.",
    )
    parser.add_argument("--version", action="version", version=f"kv-guardian {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _stand_in_for_closed_streams()
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
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
