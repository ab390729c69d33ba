"""Cost of scrubbing KV blocks that pass to another tenant (KV remanence): writes bench/results/scrub.json.

1. ns per block scrubbed: the same alternating-tenant allocate/free cycle on two pools, ``scrub="never"``
   and ``scrub="on-tenant-change"``, interleaved repeat by repeat; the difference per block scrubbed is the
   scrub's cost. Layouts: the mini engine's, and Llama-3-8B's (32 layers, 8 KV heads, head_dim 128, bf16,
   16-token blocks: 2 MiB of K/V per block) - the size real servers zero.
2. The mini engine's throughput (generated tokens/s) on a two-tenant workload whose pool is small enough that
   blocks pass between tenants, ``on-tenant-change`` against ``never``, interleaved in the same run.

    nice .venv/bin/python bench/scrub.py [--quick] [--out bench/results/scrub.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from results_io import save_json

from kvguardian.runtime.paged import KVSpec, PagedKVPool

LAYOUTS = {
    "mini (2 layers, 2 KV heads, head_dim 16, fp32)": KVSpec(2, 2, 16, "float32"),
    "Llama-3-8B (32 layers, 8 KV heads, head_dim 128, bf16)": KVSpec(32, 8, 128, "bfloat16"),
}


def cycle(pool: PagedKVPool, blocks: int, bs: int, rounds: int) -> float:
    """Seconds (thread CPU) for ``rounds`` allocations of ``blocks`` blocks, alternating two tenants."""
    t0 = time.thread_time()
    for i in range(rounds):
        rid = f"r{i}"
        pool.open(rid, "acme" if i % 2 else "globex")
        pool.append(rid, [0] * (blocks * bs))
        pool.free(rid)
    return time.thread_time() - t0


def per_block(spec: KVSpec, batch: int, repeats: int, rounds: int) -> dict[str, float]:
    bs = 16
    pools = {p: PagedKVPool(batch, bs, spec, prefix_caching=False, scrub=p) for p in ("never", "on-tenant-change")}
    times: dict[str, list[float]] = {p: [] for p in pools}
    for _ in range(repeats):  # interleaved: drift hits both alike
        for p, pool in pools.items():
            times[p].append(cycle(pool, batch, bs, rounds))
    never, scrub = statistics.median(times["never"]), statistics.median(times["on-tenant-change"])
    n = rounds * batch
    rem = pools["on-tenant-change"].remanence
    assert rem is not None and rem.scrubbed_blocks >= n  # every allocation crossed tenants
    return {"batch_blocks": batch, "block_bytes": pools["never"].block_bytes,
            "ns_per_block_never": 1e9 * never / n, "ns_per_block_scrub": 1e9 * scrub / n,
            "scrub_ns_per_block": 1e9 * (scrub - never) / n,
            "scrub_gb_per_s": pools["never"].block_bytes * n / max(scrub - never, 1e-12) / 1e9}


def engine_ratio(repeats: int, requests: int) -> dict[str, float]:
    from kvguardian.apps.repro.cross_request import make_workload, one_thread
    from kvguardian.apps.repro.models import TINY, build_llama
    from kvguardian.runtime.paged.engine import Engine, OwnershipScheduler
    from kvguardian.runtime.paged.model import PagedLlama

    hf = build_llama(TINY)
    model = PagedLlama(hf)
    reqs, _ = make_workload(requests, hf.config.vocab_size, seed=3, sys_tokens=(40, 56))
    tps: dict[str, list[float]] = {"never": [], "on-tenant-change": []}
    changes = scrubbed = 0
    with one_thread():
        for _ in range(repeats):
            for policy in tps:
                pool = PagedKVPool(48, 16, model.spec, scrub=policy)  # small: blocks pass between tenants
                res = Engine(model, OwnershipScheduler(pool), max_num_seqs=6).run(reqs)
                tps[policy].append(res.tokens / res.seconds)
                if pool.remanence is not None:
                    changes, scrubbed = pool.remanence.tenant_changes, pool.remanence.scrubbed_blocks
    ratios = [a / b for a, b in zip(tps["on-tenant-change"], tps["never"])]
    return {"requests": requests, "repeats": repeats, "tokens_per_s_never": statistics.median(tps["never"]),
            "tokens_per_s_on_tenant_change": statistics.median(tps["on-tenant-change"]),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "tenant_changes_per_run": changes, "blocks_scrubbed_per_run": scrubbed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="bench/results/scrub.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    repeats = 3 if args.quick else 7
    rows = []
    for name, spec in LAYOUTS.items():
        big = spec.num_layers > 8
        for batch in (1, 16) if big else (1, 16, 128):
            row = {"layout": name, **per_block(spec, batch, repeats, 20 if big else 200)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    eng = engine_ratio(3 if args.quick else 7, 24)
    print(json.dumps(eng), flush=True)
    out = {"bench": "scrub", "per_block": rows, "engine": eng, "created": time.time(), "loadavg": os.getloadavg(),
           "torch_threads": torch.get_num_threads()}
    save_json(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
