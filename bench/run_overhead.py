"""What `kv-guardian run` costs a whole program: wall time with and without it, in interleaved pairs.

The program is ``bench/programs/chat_server.py`` (a tiny random-weight Llama, prompts of 24-40 tokens, 16
new tokens per request) at 20, 100 and 400 requests, ``leak`` (every output kept: that many ended requests
with their holder chains at exit, the audit's worst case) and ``clean`` (an LRU of four sessions). For each
size and mode it runs plain, under run, under run, plain, ... (ABBA: drift cancels) and reports the median
wall-time ratio over the pairs - and the CPU-time ratio (user + system seconds of the processes), which a
busy shared machine disturbs far less - with what the audit itself took (from the report): the exit-time
audit (holder chains and verdicts) and the sampling during the run.

Targets (issue 12): ratio <= 1.15 at 100 requests; exit-time audit <= 2 s for 100 ended requests.

    .venv/bin/python bench/run_overhead.py                       # writes bench/results/run_overhead.json
    .venv/bin/python bench/run_overhead.py --sizes 20 --pairs 1  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from results_io import save_json

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "bench" / "programs" / "chat_server.py"


def _cpu() -> float:
    """CPU seconds of every finished child process (and theirs: `kv-guardian run` waits for the program)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _plain(n: int, mode: str) -> dict[str, Any]:
    c0, t0 = _cpu(), time.perf_counter()
    subprocess.run([sys.executable, str(PROGRAM), str(n), mode], check=True, capture_output=True, cwd=ROOT)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0}


def _audited(n: int, mode: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "r.json"
        c0, t0 = _cpu(), time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "kvguardian", "run", "--quiet", "--report", str(report),
                               "--", sys.executable, str(PROGRAM), str(n), mode], capture_output=True, cwd=ROOT)
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        if proc.returncode not in (0, 1):
            raise SystemExit(f"kv-guardian run failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
        data = json.loads(report.read_text())
    p = data["summary"]["processes"][0]
    retention = p["summary"]["retention"]
    return {"wall_s": wall, "cpu_s": cpu, "audit_s": p["audit_seconds"], "sampling_s": retention["sample_seconds"],
            "audit_cpu_s": p.get("audit_cpu_seconds"), "sampling_cpu_s": retention.get("sample_cpu_seconds"),
            "samples": retention["samples"], "findings": len(data["findings"])}


def measure(n: int, mode: str, pairs: int) -> dict[str, Any]:
    plain: list[dict[str, Any]] = []
    audited: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    for k in range(pairs):
        order = (_plain, _audited) if k % 2 == 0 else (_audited, _plain)
        for fn in order:
            (plain if fn is _plain else audited).append(fn(n, mode))
    ratios = [a["wall_s"] / p["wall_s"] for p, a in zip(plain, audited)]
    cpu_ratios = [a["cpu_s"] / p["cpu_s"] for p, a in zip(plain, audited)]
    return {
        "requests": n, "mode": mode, "pairs": pairs,
        "plain_wall_s": statistics.median(p["wall_s"] for p in plain),
        "run_wall_s": statistics.median(a["wall_s"] for a in audited),
        "ratio_median": statistics.median(ratios), "ratios": ratios,
        "cpu_ratio_median": statistics.median(cpu_ratios), "cpu_ratios": cpu_ratios,
        "plain_cpu_s": statistics.median(p["cpu_s"] for p in plain),
        "run_cpu_s": statistics.median(a["cpu_s"] for a in audited),
        "audit_s_median": statistics.median(a["audit_s"] for a in audited),
        "sampling_s_median": statistics.median(a["sampling_s"] for a in audited),
        "audit_cpu_s_median": statistics.median(a["audit_cpu_s"] for a in audited),
        "sampling_cpu_s_median": statistics.median(a["sampling_cpu_s"] for a in audited),
        "samples": audited[0]["samples"], "findings": audited[0]["findings"],
        "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after: how busy it was
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 100, 400])
    ap.add_argument("--modes", nargs="+", default=["leak", "clean"], choices=["leak", "clean"])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--pairs-400", type=int, default=None, help="pairs at 400 requests (default: --pairs)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "run_overhead.json"))
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    out = {"bench": "run_overhead", "python": platform.python_version(), "cpus": os.cpu_count(),
           "targets": {"ratio_at_100": 1.15, "audit_s_at_100": 2.0}, "rows": rows}
    for n in args.sizes:
        for mode in args.modes:
            row = measure(n, mode, args.pairs_400 if n >= 400 and args.pairs_400 else args.pairs)
            rows.append(row)
            print(f"{n:4d} {mode:5s} plain {row['plain_wall_s']:6.2f} s  run {row['run_wall_s']:6.2f} s  "
                  f"ratio {row['ratio_median']:.3f} (CPU time {row['cpu_ratio_median']:.3f})  "
                  f"audit {row['audit_s_median']:.2f} s (CPU {row['audit_cpu_s_median']:.2f})  "
                  f"sampling {row['sampling_s_median']:.2f} s (CPU {row['sampling_cpu_s_median']:.2f}, "
                  f"{row['samples']} samples)", flush=True)
            save_json(args.out, out)  # after every row: a long run keeps its rows
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
