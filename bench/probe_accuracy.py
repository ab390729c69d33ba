"""How often `kv-guardian isolation cache-sharing` is right, and how many samples it uses, on the mini server in
every cache mode: writes bench/results/probe_accuracy.json.

For each mode a real ``kv-guardian serve-mini`` subprocess is started once, then the probe runs ``--runs``
times against it over loopback HTTP (fresh random prompts and salts each time). A verdict is correct when it
equals the mode's truth; "undecided" counts as not correct. Target (issue 17): every verdict correct at
alpha = 1e-3 with power >= 0.95, <= 60 samples per procedure (the paper used 250).

    nice .venv/bin/python bench/probe_accuracy.py [--runs 10] [--out bench/results/probe_accuracy.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from results_io import save_json

from kvg_tenancy import KEY_ARGS, KEYS, mini_server
from kvguardian.isolation.cache_sharing import LEVELS, CacheSharingProbe, ProbeOptions

#: (mode, send a salt, truth of caching / within / across)
CASES = [
    ("global", False, (True, True, True)),
    ("per-tenant", False, (True, True, False)),
    ("per-salt", True, (True, True, False)),
    ("per-salt", False, (True, True, True)),
    ("off", False, (False, False, False)),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=1e-3)
    ap.add_argument("--beta", type=float, default=1e-3)
    ap.add_argument("--max-rps", type=float, default=60.0)
    ap.add_argument("--out", default="bench/results/probe_accuracy.json")
    args = ap.parse_args()
    rows = []
    for mode, salt, truth in CASES:
        with mini_server("--cache-mode", mode, *KEY_ARGS) as (url, _):
            runs = []
            for _ in range(args.runs):
                opts = ProbeOptions(url=url, model="kvg-mini", keys=[KEYS["acme"], KEYS["globex"], KEYS["acme2"]],
                                    salt_field="cache_salt" if salt else None, alpha=args.alpha, beta=args.beta,
                                    max_rps=args.max_rps)
                res = CacheSharingProbe(opts).run()
                if res.error:
                    raise SystemExit(f"probe failed: {res.error}")
                d = res.to_dict()
                runs.append({lv: (d[lv], d["levels"][lv]["samples"]) for lv in LEVELS} | {"seconds": res.seconds})
        row: dict[str, object] = {"mode": mode + (" + cache_salt" if salt else ""), "runs": len(runs)}
        for lv, want in zip(LEVELS, truth):
            got = [r[lv][0] for r in runs]
            samples = [r[lv][1] for r in runs]
            row[lv] = {"truth": want, "correct": sum(g == want for g in got),
                       "wrong": sum(g == (not want) for g in got),
                       "undecided": sum(g is None for g in got), "samples_median": statistics.median(samples),
                       "samples_max": max(samples)}
        row["seconds_per_probe"] = round(statistics.median(r["seconds"] for r in runs), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    verdicts = [row[lv] for row in rows for lv in LEVELS]
    out = {
        "bench": "probe_accuracy", "alpha": args.alpha, "beta": args.beta, "runs_per_mode": args.runs,
        "rows": rows,
        "all_correct": all(v["correct"] == args.runs for v in verdicts),  # type: ignore[index]
        "max_samples_used": max(v["samples_max"] for v in verdicts),  # type: ignore[index]
        "created": time.time(), "loadavg": os.getloadavg(),
    }
    save_json(args.out, out)
    print(f"all correct: {out['all_correct']}, max samples used: {out['max_samples_used']} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
