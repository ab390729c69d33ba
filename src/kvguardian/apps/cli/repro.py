"""``kv-guardian repro NAME``: run one reproduction of the article's anti-patterns, with measurements."""

from __future__ import annotations

import argparse

from kvguardian.apps.cli.options import add_format, add_subcommands, example
from kvguardian.apps.repro import REPROS, load
from kvguardian.core.errors import EXIT_FINDINGS, EXIT_OK
from kvguardian.core.report.output import add_html_option, check_writable
from kvguardian.core.report.reporter import reporting

NAME = "repro"
HELP = "reproduce one KV-leak anti-pattern, measure it here, and check the detector and the fix"
EXAMPLE = "kv-guardian repro orphaned --requests 8"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = add_subcommands(p, "repro", "NAME")
    for name in REPROS:
        module = load(name)
        rp = sub.add_parser(name, help=module.TITLE, description=(module.__doc__ or module.TITLE).strip(),
                            epilog=example(f"kv-guardian repro {name} --json"))
        module.add_arguments(rp)
        add_format(rp, json_help="print the measurements as JSON")
        add_html_option(rp)
        rp.set_defaults(repro_module=module)


def run(args: argparse.Namespace) -> int:
    if args.html:
        check_writable(args.html, "--html")  # before the reproduction runs
    result = args.repro_module.run(args)
    with reporting("json" if args.format == "json" else "console", html=args.html) as out:
        result.show(out)
        out.result(result.to_dict())
    return EXIT_OK if result.ok else EXIT_FINDINGS
