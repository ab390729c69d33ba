"""Speed of ``kv-guardian lint`` on real Python code: writes bench/results/lint_speed.json.

The code is a real package's sources (default: the installed ``transformers``, 1.2M lines, present wherever
the dev set-up ran; ``--path DIR`` for another tree). The anchor, measured in the same run and interleaved
with the linter round by round, is ``ast.parse`` alone over the same files: the ratio says what the rules
and the index cost on top of parsing. Times are this process's CPU time (``time.process_time``): the machine
is shared and waiting for a core is not the linter's cost. Target (issue 15): >= 5,000 lines/s.

    .venv/bin/python bench/lint_speed.py [--path DIR] [--rounds 3] [--out bench/results/lint_speed.json]
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

from results_io import write_json

from kvguardian.lint import LintConfig, lint_paths
from kvguardian.lint.files import discover, read_source


def _default_path() -> str:
    import transformers

    return str(Path(transformers.__file__).parent)


def _parse_only(paths: list[str]) -> tuple[float, int]:
    t0 = time.process_time()
    lines = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for p in paths:
            src = read_source(p)
            if isinstance(src, str) or not hasattr(src, "text"):
                continue
            try:
                ast.parse(src.text)
            except (SyntaxError, ValueError, RecursionError):
                continue
            lines += src.text.count("\n")
    return time.process_time() - t0, lines


def _lint(root: str) -> tuple[float, int, int, int]:
    t0 = time.process_time()
    result = lint_paths([root], LintConfig())
    return time.process_time() - t0, result.lines, result.files, len(result.diagnostics)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default=None, help="a source tree (default: the installed transformers package)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/lint_speed.json")
    args = ap.parse_args()
    root = args.path or _default_path()
    files = [p for p in discover([root], LintConfig()) if isinstance(p, str) and p.endswith(".py")]
    lint_rates, parse_rates, ratios = [], [], []
    lines = nfiles = findings = 0
    for _ in range(args.rounds):  # interleaved: lint, then the anchor, each round
        t_lint, lines, nfiles, findings = _lint(root)
        t_parse, parse_lines = _parse_only(files)
        lint_rates.append(lines / t_lint)
        parse_rates.append(parse_lines / t_parse)
        ratios.append(t_lint / t_parse)
    out = {
        "benchmark": "lint_speed",
        "path": root,
        "files": nfiles,
        "lines": lines,
        "findings": findings,
        "rounds": args.rounds,
        "lint_lines_per_s_median": round(statistics.median(lint_rates)),
        "lint_lines_per_s_all": [round(r) for r in lint_rates],
        "anchor_ast_parse_lines_per_s_median": round(statistics.median(parse_rates)),
        "lint_time_over_parse_time_median": round(statistics.median(ratios), 3),
        "target_lines_per_s": 5000,
        "clock": "process_time",
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
    }
    write_json(args.out, out)


if __name__ == "__main__":
    main()
