"""``kv-guardian lint PATH…``: static KV-leak checks (KVG4xx) for Python, Go, Java and Kotlin sources.

Exit status: 0 no findings, 1 findings, 2 a usage error (unknown rule, bad config, missing path only).
Files that cannot be linted (syntax errors, binary, not UTF-8, symlink loops) are listed on stderr in text
format and in the report otherwise; they do not change the exit status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvguardian.apps.cli.options import add_format, add_output
from kvguardian.core.errors import EXIT_FINDINGS, EXIT_OK, UsageError
from kvguardian.core.report.output import check_outputs
from kvguardian.lint.config import load_config
from kvguardian.lint.diagnostic import Skipped
from kvguardian.lint.files import LANGUAGES
from kvguardian.lint.output import FORMATS, clean, render
from kvguardian.lint.rules import RULES
from kvguardian.lint.runner import lint_paths

NAME = "lint"
HELP = "find KV-leak anti-patterns in source code (KVG4xx): Python, and Redis clients in Go, Java, Kotlin"
EXAMPLE = "kv-guardian lint src/ --format sarif -o lint.sarif"


def _csv(value: str) -> list[str]:
    return [v.strip().upper() if v.strip().upper() != "ALL" else "ALL" for v in value.split(",") if v.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or directories (default: .)")
    add_format(p, json_help="write the report as JSON", formats=FORMATS)
    p.add_argument("--select", type=_csv, metavar="IDS", help="comma-separated rule ids or prefixes to run (KVG4)")
    p.add_argument("--ignore", type=_csv, metavar="IDS", help="comma-separated rule ids or prefixes to skip")
    p.add_argument("--extend-exclude", type=lambda v: [x for x in v.split(",") if x], metavar="GLOBS",
                   help="more glob patterns to leave out")
    p.add_argument("--config", type=Path, metavar="PYPROJECT",
                   help="read [tool.kv-guardian.lint] from this file (default: the nearest pyproject.toml)")
    add_output(p, "write the report to FILE instead of stdout", convert=Path)
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    p.add_argument("--list-rules", action="store_true", help="print the rules and exit")


def _list_rules() -> int:
    from kvguardian.core.findings import CATALOG

    for rid in RULES:
        print(f"{rid}  {CATALOG[rid].name:28s} {CATALOG[rid].meaning}")
    return EXIT_OK


def _sources_hit(output: str, paths: list[str]) -> list[str]:
    """The linted paths ``-o OUTPUT`` would replace: a file named on the command line, or an existing source
    file inside a linted folder."""
    out = Path(output)
    hit = [p for p in paths if Path(p).is_file()]
    if out.is_file() and out.suffix.lower() in LANGUAGES:
        real = out.resolve()
        hit += [str(out) for p in paths if Path(p).is_dir() and real.is_relative_to(Path(p).resolve())]
    return hit


def run(args: argparse.Namespace) -> int:
    if args.list_rules:
        return _list_rules()
    config = load_config(args.config).with_cli(args.select, args.ignore, args.extend_exclude)
    config.enabled(RULES)  # unknown selectors: a usage error before any work
    paths = args.paths or ["."]
    if args.output is not None:  # an unwritable report file, or one of the sources: before the tree is linted
        check_outputs([("--output", args.output)], [("a file linted", p) for p in _sources_hit(args.output, paths)])
    stream_skips = args.format == "text"

    def on_skip(s: Skipped) -> None:
        if stream_skips:
            where = f":{s.line}" if s.line else ""
            sys.stderr.write(f"kv-guardian lint: {clean(s.path)}{where}: {clean(s.reason)}\n")

    result = lint_paths(paths, config, on_skip=on_skip)
    if result.files == 0 and result.skipped and len(result.skipped) == len(paths) and all(
            "no such file" in s.reason for s in result.skipped):
        raise UsageError(f"no such file or directory: {', '.join(paths)}")
    text = render(result, args.format)
    if args.output is not None:
        try:
            args.output.write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {str(args.output)!r}: {exc.strerror}; choose another --output") from None
    else:
        sys.stdout.write(text + ("\n" if text else ""))
    return EXIT_FINDINGS if result.diagnostics and not args.exit_zero else EXIT_OK
