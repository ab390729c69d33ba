"""The ``kv-guardian`` command line: one module per command, kept apart from reporters.

Every command module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. `main`
turns kv-guardian's own errors into one line on stderr and an exit code; a traceback is shown only for a bug,
and only with ``KVG_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from kvguardian import __version__
from kvguardian._errors import EXIT_INTERNAL, EXIT_USAGE, KVGuardianError

__all__ = ["COMMANDS", "build_parser", "main"]

#: command name -> module. Add a line here to add a command.
COMMANDS: dict[str, str] = {
    "demo": "kvguardian.cli.demo",
    "repro": "kvguardian.cli.repro",
    "exporter": "kvguardian.cli.exporter",
    "watch": "kvguardian.cli.watch",
    "redis": "kvguardian.cli.redis",
    "sweep": "kvguardian.cli.sweep",
    "run": "kvguardian.cli.run",
    "lint": "kvguardian.cli.lint",
    "oom-guard": "kvguardian.cli.oom_guard",
    "device-plugin": "kvguardian.cli.device_plugin",
    "serve-mini": "kvguardian.cli.serve_mini",
    "audit": "kvguardian.cli.audit",
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: what, where, and the fix (``--help``)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}; see '{self.prog} --help'\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="kv-guardian",
        description="Find, prove and prevent KV-cache leaks in LLM inference and key-space leaks in Redis.",
    )
    parser.add_argument("--version", action="version", version=f"kv-guardian {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(run(args) or 0)
    except KVGuardianError as exc:
        sys.stderr.write(f"kv-guardian {args.command}: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"kv-guardian {args.command}: interrupted\n")
        return 130
    except BrokenPipeError:  # e.g. piped into head
        return 0
    except Exception as exc:  # a bug: one line, the traceback only on request
        if os.environ.get("KVG_DEBUG"):
            raise
        sys.stderr.write(
            f"kv-guardian {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(this is a bug in kv-guardian; rerun with KVG_DEBUG=1 for the traceback)\n"
        )
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
