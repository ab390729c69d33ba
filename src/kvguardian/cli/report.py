"""``kv-guardian report FILE.json -o report.html [--memory-snapshot OUT.pickle] [--trace OUT.json]``.

Renders any report kv-guardian writes (``run --report``, ``Guard.check().to_json()``, ``redis scan --json``,
``redis diff --json``, ``watch --json``, ``repro NAME --json``, ``pytest --kv-report``) as one self-contained
HTML file, and exports a KV history as a PyTorch memory snapshot or a Chrome/Perfetto trace. Every output is
checked before anything is written; a file that cannot be read is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvguardian._errors import EXIT_OK, UsageError

NAME = "report"
HELP = ("render a report JSON as a self-contained HTML page; export its KV history for PyTorch's memory viewer "
        "or Perfetto")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE.json", help="a report written by kv-guardian (any kind)")
    p.add_argument("-o", "--output", metavar="HTML", help="write the HTML report here")
    p.add_argument("--memory-snapshot", metavar="OUT.pickle",
                   help="write the KV history as a PyTorch memory snapshot (python -m torch.cuda._memory_viz "
                        "trace_plot OUT.pickle -o kv.html)")
    p.add_argument("--trace", metavar="OUT.json", help="write the KV history as a Chrome/Perfetto trace")
    p.add_argument("--redact", action="store_true",
                   help="show the report as --redact would have written it: dictionary keys in holder chains "
                        "hidden, Redis key names and patterns hashed")


def _writable(path: str, flag: str) -> None:
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        problem = "is a folder"
    elif not folder.is_dir():
        problem = f"is in a folder that does not exist ({folder})"
    elif (p.exists() and not os.access(p, os.W_OK)) or (not p.exists() and not os.access(folder, os.W_OK | os.X_OK)):
        problem = "cannot be written by this user"
    else:
        return
    raise UsageError(f"{flag} {path!r} {problem}; fix: pass a writable file path")


def run(args: argparse.Namespace) -> int:
    from kvguardian.report.document import load_document
    from kvguardian.report.exports import kv_audits, write_memory_snapshot_of, write_trace_of
    from kvguardian.report.html import write_html

    outputs = [(args.output, "-o"), (args.memory_snapshot, "--memory-snapshot"), (args.trace, "--trace")]
    if not any(path for path, _ in outputs):
        raise UsageError("nothing to write; fix: kv-guardian report FILE.json -o report.html (and/or "
                         "--memory-snapshot OUT.pickle, --trace OUT.json)")
    for path, flag in outputs:
        if path:
            _writable(path, flag)
    doc = load_document(args.file, redact=args.redact)
    audits = kv_audits(doc, "--memory-snapshot/--trace") if (args.memory_snapshot or args.trace) else []
    done = []
    if args.output:
        n = write_html(doc, args.output)
        done.append(f"{args.output} ({n:,} bytes, {len(doc.findings)} finding(s))")
    if args.memory_snapshot:
        n = write_memory_snapshot_of(audits, args.memory_snapshot)
        done.append(f"{args.memory_snapshot} ({n:,} bytes; view: python -m torch.cuda._memory_viz trace_plot "
                    f"{args.memory_snapshot} -o kv.html)")
    if args.trace:
        n = write_trace_of(audits, args.trace)
        done.append(f"{args.trace} ({n:,} bytes; open in Perfetto or chrome://tracing)")
    for line in done:
        sys.stderr.write(f"kv-guardian report: wrote {line}\n")
    return EXIT_OK

