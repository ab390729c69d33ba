"""Option groups that several commands share, each written once (``--web-config`` is in `web_options`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_duration_option", "add_subcommands"]


def add_subcommands(p: argparse.ArgumentParser, dest: str, metavar: str) -> Any:
    """A required subcommand under ``p`` (``kv-guardian redis SUBCOMMAND``); its parsers are of ``p``'s class, so
    a bad word is the same one-line usage error as at the top level."""
    sub = p.add_subparsers(dest=dest, metavar=metavar, parser_class=type(p))
    sub.required = True
    return sub


def add_duration_option(p: argparse.ArgumentParser) -> None:
    """``--duration S`` of a command that serves until stopped."""
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
