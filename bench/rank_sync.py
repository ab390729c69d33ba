"""Benchmark of the two fixes for §2.4 (visual-token KV across ranks): writes bench/results/rank_sync.json.

Two real gloo ranks on loopback (forked processes) serve image+text sequences on a tiny LLaVA three ways
(`kvguardian.apps.repro.multimodal`): the buggy variant (its only collective is the visual-token broadcast from the
vision rank: the baseline), the per-layer K/V broadcast fix, and the ref count + int64 all-reduce fix. Per
sequence: bytes through collectives, and the latency of that sequence's collectives replayed alone after a
barrier (median of 50), for the configurations below. Ratios are against the baseline measured in the same run.
The machine may be shared: the JSON records the load average.

    .venv/bin/python bench/rank_sync.py [--quick] [--out bench/results/rank_sync.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from results_io import save_json

from kvguardian.apps.repro.multimodal import VARIANTS, measure
from kvguardian.apps.repro.vlm import VlmSpec

CONFIGS = {
    "tiny": VlmSpec(),
    "wider": VlmSpec(image_size=128, patch_size=8, hidden=256, layers=4, heads=8, kv_heads=4, intermediate=512),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny configuration only, 3 sequences")
    p.add_argument("--out", default="bench/results/rank_sync.json")
    args = p.parse_args()
    configs = {"tiny": CONFIGS["tiny"]} if args.quick else CONFIGS
    results = {}
    for name, spec in configs.items():
        t0 = time.perf_counter()
        data = measure(sequences=3 if args.quick else 8, new_tokens=4, spec=spec)
        v = data["variants"]
        base_b = v["buggy"]["comm_bytes_per_sequence"]
        base_ms = v["buggy"]["comm_ms_per_sequence"]
        results[name] = {
            "model": spec.describe(),
            "visual_kv_bytes_per_image": spec.visual_kv_bytes(),
            "sequences": data["sequences"],
            "ok": data["ok"],
            "variants": {
                k: {
                    "collectives_per_sequence": v[k]["collectives_per_sequence"],
                    "comm_bytes_per_sequence": v[k]["comm_bytes_per_sequence"],
                    "comm_ms_per_sequence": round(v[k]["comm_ms_per_sequence"], 4),
                    "bytes_ratio_vs_baseline": round(v[k]["comm_bytes_per_sequence"] / base_b, 4),
                    "latency_ratio_vs_baseline": round(v[k]["comm_ms_per_sequence"] / base_ms, 3) if base_ms else None,
                    "kvg106": v[k]["kvg106_count"],
                }
                for k in VARIANTS
            },
            "seconds": round(time.perf_counter() - t0, 2),
        }
        for k in VARIANTS:
            r = results[name]["variants"][k]
            print(f"{name:<6} {k:<10} {r['comm_bytes_per_sequence']:>12,.0f} B/seq ({r['bytes_ratio_vs_baseline']}x) "
                  f"{r['comm_ms_per_sequence']:>8.3f} ms/seq ({r['latency_ratio_vs_baseline']}x)")
    out = {
        "benchmark": "rank_sync",
        "baseline": "buggy variant: the visual-token broadcast alone",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "loadavg": os.getloadavg()},
        "results": results,
    }
    path = save_json(args.out, out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
