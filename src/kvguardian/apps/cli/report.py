"""``kv-guardian report FILE.json -o report.html [--memory-snapshot OUT.pickle] [--trace OUT.json]``.

Renders any report kv-guardian writes (``run -o``, ``Guard.check().to_json()``, ``redis scan --json``,
``redis diff --json``, ``watch --json``, ``repro NAME --json``, ``pytest --kv-report``) as one self-contained
HTML file, and exports a KV history as a PyTorch memory snapshot or a Chrome/Perfetto trace. Every output is
checked before anything is written; a file that cannot be read is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvguardian.apps.cli.options import add_output
from kvguardian.core.errors import EXIT_OK, UsageError
from kvguardian.core.report.escape import visible
from kvguardian.core.report.output import check_outputs

NAME = "report"
HELP = ("render a report JSON as a self-contained HTML page; export its KV history for PyTorch's memory viewer "
        "or Perfetto")
EXAMPLE = "kv-guardian report kv.json -o report.html"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE.json", help="a report written by kv-guardian (any kind)")
    add_output(p, "write the HTML report to FILE")
    p.add_argument("--memory-snapshot", metavar="OUT.pickle",
                   help="write the KV history as a PyTorch memory snapshot (python -m torch.cuda._memory_viz "
                        "trace_plot OUT.pickle -o kv.html)")
    p.add_argument("--trace", metavar="OUT.json", help="write the KV history as a Chrome/Perfetto trace")
    p.add_argument("--redact", action="store_true",
                   help="show the report as --redact would have written it: dictionary keys in holder chains "
                        "hidden, Redis key names and patterns hashed")


def run(args: argparse.Namespace) -> int:
    from kvguardian.core.report.document import load_document
    from kvguardian.core.report.exports import OutputsNotWritten, write_outputs

    outputs = [(args.output, "-o"), (args.memory_snapshot, "--memory-snapshot"), (args.trace, "--trace")]
    if not any(path for path, _ in outputs):
        raise UsageError("nothing to write; fix: kv-guardian report FILE.json -o report.html (and/or "
                         "--memory-snapshot OUT.pickle, --trace OUT.json)")
    check_outputs([(flag, path) for path, flag in outputs], [("the report read (FILE)", args.file)])
    doc = load_document(args.file, redact=redact_report if args.redact else None)
    try:
        done = write_outputs(doc, html=args.output, memory_snapshot=args.memory_snapshot, trace=args.trace,
                             flags=("-o", "--memory-snapshot", "--trace"))
    except OutputsNotWritten as exc:
        _wrote(exc.done)
        raise
    _wrote(done)
    return EXIT_OK


def _wrote(lines: list[str]) -> None:
    for line in lines:
        sys.stderr.write(visible(f"kv-guardian report: wrote {line}") + "\n")


def redact_report(data: object) -> Any:
    """A copy of report JSON ``data`` as its producer's ``--redact`` would have written it: Redis scans and
    diffs by `kvguardian.keyspace.redact`, KV reports by `kvguardian.core.report.redact` (holder-chain keys)."""
    from kvguardian.core.report.redact import redact_chains
    from kvguardian.keyspace.redact import is_keyspace_json, redact_keyspace_json

    return redact_keyspace_json(data) if is_keyspace_json(data) else redact_chains(data)
