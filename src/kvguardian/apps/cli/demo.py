"""``kv-guardian demo``: every reproduction available, measured here, in one table."""

from __future__ import annotations

import argparse
import time
from typing import Any

from kvguardian.apps.cli.options import add_format
from kvguardian.apps.repro import REPROS, DemoRow, load, not_built_rows, section_order
from kvguardian.core.errors import EXIT_FINDINGS, EXIT_OK, UsageError

NAME = "demo"
HELP = "reproduce the KV-leak anti-patterns on a built-in tiny model and print one table (no services)"
EXAMPLE = "kv-guardian demo --only orphaned --json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", action="append", metavar="NAME", choices=list(REPROS),
                   help="run only these reproductions (repeatable)")
    add_format(p, json_help="print the rows as JSON")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads while the rows run (default: 1; the tiny models run 3-10x faster "
                        "single-threaded on a busy 2-core machine, and no memory figure depends on it)")


def _threads(n: int) -> Any:
    """torch's intra-op threads set to ``n`` for the rows (nothing to set without torch)."""
    import contextlib

    try:
        import torch  # noqa: F401
    except ImportError:
        return contextlib.nullcontext()
    from kvguardian.apps.repro.threads import torch_threads

    return torch_threads(n)


def run(args: argparse.Namespace) -> int:
    from kvguardian.core.report.console import ConsoleReporter
    from kvguardian.core.report.reporter import reporting

    names = args.only or list(REPROS)
    rows: list[DemoRow] = []
    t0 = time.perf_counter()
    err = ConsoleReporter(stderr=True)
    if not 1 <= args.threads <= 1024:
        raise UsageError(f"--threads {args.threads} is out of range; fix: use 1..1024")
    with _threads(args.threads):
        for name in names:
            module = load(name)
            if args.format != "json":
                err.text(f"running {name} …")
            started = time.perf_counter()
            try:
                row = module.demo_row()
            except UsageError:
                raise
            except Exception as exc:  # one broken row must not hide the others
                row = DemoRow(name, getattr(module, "SECTION", ""), "", f"failed: {type(exc).__name__}: {exc}",
                              "n/a", None, ok=False)
            row.seconds = time.perf_counter() - started  # every row timed here, the reproductions' own included
            rows.append(row)
    if not args.only:  # the article's five always show, built or not
        rows = sorted(rows + not_built_rows(), key=section_order)
    total = time.perf_counter() - t0
    with reporting("json" if args.format == "json" else "console") as out:
        out.table(
            "kv-guardian demo — the article's claims, measured here",
            ["reproduction", "article claims", "measured here", "detector verdict", "fix verified"],
            [
                [f"{r.section} {r.name}".strip(), r.article_claim, r.measured, r.verdict,
                 {True: "yes", False: "NO", None: "—"}[r.fix_verified]]
                for r in rows
            ],
        )
        out.text(f"{len(rows)} reproduction(s) in {total:.1f} s on this machine")
        out.result({"rows": [r.to_dict() for r in rows], "seconds": round(total, 2)})
    return EXIT_OK if all(r.ok for r in rows) else EXIT_FINDINGS
