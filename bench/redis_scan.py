"""Benchmark: kv-guardian's Redis scan against ``redis-cli --memkeys`` on the same data, in one run.

    .venv/bin/python bench/redis_scan.py                 # 1,000,000 keys (the issue's setting)
    .venv/bin/python bench/redis_scan.py --keys 100000   # a quicker look

Starts its own redis-server on a free loopback port, loads ``--keys`` keys of eight patterns with a
pipelined loader (``redis-cli --pipe``), then measures, on that one data set:

1. ``redis-cli --memkeys`` (memory only: no TTL, no idle time, no patterns): keys/s;
2. ``kv-guardian redis scan`` through the read-only Lua path and through the pipeline fallback: keys/s
   (type, MEMORY USAGE, PTTL, OBJECT IDLETIME per key, plus pattern mining and per-pattern statistics);
3. pattern mining alone on the same key names (keys/s; it must keep up with the scan);
4. interleaved ``--reps`` times (medians; the host may be shared): a concurrent ``redis-benchmark`` GET
   load's p99 alone, during ``redis-cli --memkeys`` and during a default scan, with each one's keys/s
   (the targets compare the default scan with memkeys under the same load);
5. the p99 latency of that GET load: without a scan (baseline), during
   ``redis-cli --memkeys``, then during scans along a trade-off curve: the default (adaptive batch, at most
   0.5 ms a call, client thread at nice +10), adaptive at 0.25 and 1 ms, the default without nice, and fixed
   batches 25, 50, 100, 200; each row has the scan's keys/s against memkeys' and its worst call.

Writes ``bench/results/redis_scan.json`` (ratios against the baselines of the same run) and prints it.
Numbers depend on the machine: a shared 2-core VM runs redis-server, the scan and redis-benchmark on
the same two cores, which inflates latencies and lowers throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from results_io import save_json

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resp(*args: str | bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def commands(n: int) -> tuple[dict[str, int], list[tuple[bytes, bytes]]]:
    """Eight patterns, some leaking (no TTL, timestamps in names), some healthy: keys per pattern, and each
    key's name with the command that writes it (in the Redis protocol)."""
    rnd = random.Random(7)
    counts: dict[str, int] = {}
    chunks: list[tuple[bytes, bytes]] = []

    def add(pattern: str, cmd: bytes) -> None:
        counts[pattern] = counts.get(pattern, 0) + 1
        chunks.append((cmd.split(b"\r\n")[4], cmd))  # *N, $len, verb, $len, key

    for i in range(n):
        r = i % 20
        if r < 6:
            add("session:{uuid}", resp("SET", f"session:{uuid.UUID(int=rnd.getrandbits(128))}", "s" * 48,
                                       "EX", "86400"))
        elif r < 10:
            add("user:{int}:profile", resp("HSET", f"user:{i}:profile", "name", "n", "plan", "free"))
        elif r < 13:
            add("tmp_{ts_ns}", resp("SET", f"tmp_{1_712_345_678_000_000_000 + i * 1_000_003}", "t" * 24))
        elif r < 15:
            add("cache:{hex}", resp("SET", f"cache:{rnd.getrandbits(160):040x}", "c" * 96, "EX", "86400"))
        elif r < 17:
            add("events:{date}:{int}", resp("RPUSH", f"events:2024-03-{i % 28 + 1:02d}:{i}", "a", "b", "c"))
        elif r < 18:
            add("ip:{ip}:hits", resp("SET", f"ip:10.{i % 250}.{(i // 250) % 250}.{i % 199}:hits:{i}", "1"))
        elif r < 19:
            add("rate:{str}:{int}", resp("INCR", f"rate:{rnd.choice(['api', 'web', 'cli'])}:{i}"))
        else:
            add("job:{int}:{rand}", resp("SET", f"job:{i}:{''.join(rnd.choices('abcdefXYZ0123456789', k=14))}", "j"))
    return counts, chunks


def pipe(port: int, chunks: list[bytes]) -> None:
    """Write ``chunks`` (commands in the Redis protocol) to the server on ``port`` with ``redis-cli --pipe``."""
    proc = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=b"".join(chunks), capture_output=True)
    if proc.returncode != 0 or b"errors: 0" not in proc.stdout:
        raise SystemExit(f"loading failed: {proc.stdout[-300:]!r} {proc.stderr[-300:]!r}")


def load(port: int, n: int) -> dict[str, int]:
    """`commands` written to the server on ``port``; keys per pattern."""
    counts, chunks = commands(n)
    pipe(port, [cmd for _, cmd in chunks])
    return counts


def server_cpu(port: int) -> float:
    """redis-server's CPU seconds so far (INFO cpu): what a scan costs the server, whatever else runs."""
    import redis

    info = redis.Redis(port=port).info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def client_cpu(children: bool = False) -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _costs(port: int, keys: int, s0: float, c0: float, children: bool) -> dict[str, float]:
    return {"server_cpu_us_per_key": round((server_cpu(port) - s0) / keys * 1e6, 2),
            "client_cpu_us_per_key": round((client_cpu(children) - c0) / keys * 1e6, 2)}


def memkeys(port: int) -> dict[str, Any]:
    s0, c0 = server_cpu(port), client_cpu(children=True)
    t0 = time.perf_counter()
    proc = subprocess.run(["redis-cli", "-p", str(port), "--memkeys"], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    scanned = 0
    for line in proc.stdout.splitlines():
        if line.startswith("Sampled ") and " keys in the keyspace" in line:
            scanned = int(line.split()[1])
    return {"seconds": round(dt, 3), "keys": scanned, "keys_per_s": round(scanned / dt),
            **_costs(port, max(scanned, 1), s0, c0, children=True)}


def kvg_scan(url: str, mode: str, batch: int = 0, port: int = 0, *, max_call_ms: float = 0.5,
              nice: int = 10) -> dict[str, Any]:
    """One scan at the given pacing (batch 0: adaptive to max_call_ms; nice: the client thread's nice)."""
    from kvguardian.keyspace.scan import ScanOptions, scan

    s0, c0 = (server_cpu(port), client_cpu()) if port else (0.0, 0.0)
    t0 = time.perf_counter()
    result = scan(url, ScanOptions(mode=mode, batch=batch, max_call_ms=max_call_ms, nice=nice))
    dt = time.perf_counter() - t0
    out = {"mode": result.mode, "batch": batch, "max_call_ms": max_call_ms, "nice": nice, "seconds": round(dt, 3),
           "keys": result.keys_scanned, "keys_per_s": round(result.keys_scanned / dt),
           "patterns": len(result.patterns), "complete": result.complete,
           "pacing": result.server.get("pacing"), "pattern_names": [p["pattern"] for p in result.patterns]}
    if port:
        out.update(_costs(port, max(result.keys_scanned, 1), s0, c0, children=False))
    return out


def mining(port: int, limit: int) -> dict[str, Any]:
    """Pattern mining alone (plus per-pattern statistics on a synthetic probe) over the server's key names."""
    import numpy as np
    import redis

    from kvguardian.keyspace.patterns import PatternMiner
    from kvguardian.keyspace.scan import mine_and_count
    from kvguardian.keyspace.stats import PatternStats

    r = redis.Redis(port=port)
    names = list(r.scan_iter(count=1000))[:limit]
    stats = PatternStats(cold_after=86400)
    miner = PatternMiner(on_merge=stats.merge)
    probe = np.tile(np.array([[0, 100, -1, 50]], dtype=np.int64), (200, 1))
    t0 = time.perf_counter()
    for i in range(0, len(names), 200):
        batch = names[i:i + 200]
        mine_and_count(miner, stats, batch, probe[: len(batch)])
    dt = time.perf_counter() - t0
    return {"keys": len(names), "seconds": round(dt, 3), "keys_per_s": round(len(names) / dt),
            "patterns": miner.live}


def get_load(port: int, requests: int) -> dict[str, Any]:
    """redis-benchmark GET with 4 clients; its own latency percentiles (ms)."""
    proc = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "get", "-n", str(requests), "-c", "4",
                           "--csv"], capture_output=True, text=True)
    header, row = None, None
    for line in proc.stdout.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells and cells[0] == "test":
            header = cells
        elif cells and cells[0] == "GET":
            row = cells
    if header is None or row is None:
        raise SystemExit(f"redis-benchmark gave no CSV: {proc.stdout[-300:]} {proc.stderr[-300:]}")
    data = dict(zip(header, row))
    return {"requests": requests, "rps": float(data["rps"]), "p50_ms": float(data["p50_latency_ms"]),
            "p99_ms": float(data["p99_latency_ms"]), "max_ms": float(data["max_latency_ms"])}


def latency_during_scan(port: int, url: str, batch: int, requests: int, *, max_call_ms: float = 0.5,
                         nice: int = 10, memkeys_instead: bool = False) -> dict[str, Any]:
    """Start a GET load, scan (or run redis-cli --memkeys) while it runs; report the load's p99 and how much
    of it overlapped the scan."""
    out: dict[str, Any] = {}
    window: dict[str, float] = {}

    def load_thread() -> None:
        window["load_start"] = time.perf_counter()
        out.update(get_load(port, requests))
        window["load_end"] = time.perf_counter()

    t = threading.Thread(target=load_thread)
    t.start()
    time.sleep(0.3)
    window["scan_start"] = time.perf_counter()
    scan = memkeys(port) if memkeys_instead else kvg_scan(url, "auto", batch, max_call_ms=max_call_ms, nice=nice)
    window["scan_end"] = time.perf_counter()
    t.join()
    lo = max(window["load_start"], window["scan_start"])
    hi = min(window["load_end"], window["scan_end"])
    out.update({"what": "redis-cli --memkeys" if memkeys_instead else "kvg scan", "batch": batch,
                "max_call_ms": max_call_ms, "nice": nice})
    out["scan_keys_per_s"] = scan["keys_per_s"]
    out["worst_call_ms"] = (scan.get("pacing") or {}).get("worst_call_ms")
    out["load_overlapping_scan"] = round(max(0.0, hi - lo) / (window["load_end"] - window["load_start"]), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "redis_scan.json"))
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds of memkeys / default scan / no scan")
    ap.add_argument("--no-curve", action="store_true", help="only the interleaved rounds, not the trade-off curve")
    args = ap.parse_args()
    for binary in ("redis-server", "redis-cli", "redis-benchmark"):
        if shutil.which(binary) is None:
            raise SystemExit(f"{binary} is not installed; run ./scripts/setup.sh --services")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="kvg-bench-")
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        time.sleep(0.5)
        t0 = time.perf_counter()
        counts = load(port, args.keys)
        load_s = time.perf_counter() - t0
        results: dict[str, Any] = {
            "keys": args.keys, "patterns_loaded": counts, "load_seconds": round(load_s, 2),
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                        "redis": subprocess.run(["redis-server", "--version"], capture_output=True,
                                                text=True).stdout.split()[2]},
        }
        results["redis_cli_memkeys"] = memkeys(port)
        results["kvg_scan_lua"] = kvg_scan(url, "lua", port=port)
        results["kvg_scan_pipeline"] = kvg_scan(url, "pipeline", port=port)
        results["mining_only"] = mining(port, args.keys)
        base = results["redis_cli_memkeys"]["keys_per_s"]
        lua = results["kvg_scan_lua"]
        results["ratios"] = {
            "lua_vs_memkeys": round(results["kvg_scan_lua"]["keys_per_s"] / base, 2),
            "pipeline_vs_memkeys": round(results["kvg_scan_pipeline"]["keys_per_s"] / base, 2),
            "mining_vs_lua_scan": round(results["mining_only"]["keys_per_s"] / lua["keys_per_s"], 2),
            "server_cpu_per_key_lua_vs_memkeys": round(results["kvg_scan_lua"]["server_cpu_us_per_key"]
                                                       / results["redis_cli_memkeys"]["server_cpu_us_per_key"], 2),
        }
        results["load_average_1m"] = os.getloadavg()[0]  # other work on this machine during the run
        requests = max(20_000, int(results["kvg_scan_lua"]["seconds"] * 8_000))
        # the headline pair, interleaved --reps times under the same GET load (medians): memkeys, the default
        # scan, and the load alone
        rounds: dict[str, list[dict[str, Any]]] = {"baseline": [], "memkeys": [], "default": []}
        for rep in range(args.reps):
            order = list(rounds) if rep % 2 == 0 else list(rounds)[::-1]
            for name in order:
                if name == "baseline":
                    row = get_load(port, requests)
                else:
                    row = latency_during_scan(port, url, 0, requests, memkeys_instead=name == "memkeys")
                rounds[name].append(row)
                print(name, json.dumps(row), file=sys.stderr)
        results["interleaved"] = rounds
        med = {name: {k: statistics.median(r[k] for r in rows) for k in ("p99_ms", "scan_keys_per_s")
                      if k in rows[0]} for name, rows in rounds.items()}
        results["interleaved_median"] = med
        results["get_p99_baseline"] = get_load(port, requests)
        curve = [  # (batch, max_call_ms, nice): the default first
            (0, 0.5, 10), (0, 0.25, 10), (0, 1.0, 10), (0, 0.5, 0), (25, 0.5, 10), (50, 0.5, 10), (100, 0.5, 10),
            (200, 0.5, 10), (200, 0.5, 0),
        ]
        rows = [latency_during_scan(port, url, 0, requests, memkeys_instead=True)]
        for batch, call_ms, nice in [] if args.no_curve else curve:
            rows.append(latency_during_scan(port, url, batch, requests, max_call_ms=call_ms, nice=nice))
            print(json.dumps(rows[-1]), file=sys.stderr)
        results["get_p99_during_scan"] = rows
        base_p99 = results["get_p99_baseline"]["p99_ms"]
        for row in rows:
            row["p99_vs_baseline"] = round(row["p99_ms"] / base_p99, 2) if base_p99 else None
            row["keys_per_s_vs_memkeys"] = round(row["scan_keys_per_s"] / base, 2)
        d, m = med["default"], med["memkeys"]
        results["targets"] = {
            "default_scan_p99_le_1ms": d["p99_ms"] <= 1.0,
            "default_scan_keys_per_s_ge_memkeys_same_load": d["scan_keys_per_s"] >= m["scan_keys_per_s"],
            "default_p99_ms_median": d["p99_ms"], "baseline_p99_ms_median": med["baseline"]["p99_ms"],
            "default_keys_per_s_median": d["scan_keys_per_s"],
            "memkeys_keys_per_s_same_load_median": m["scan_keys_per_s"], "memkeys_p99_ms_median": m["p99_ms"],
            "default_vs_memkeys_same_load": round(d["scan_keys_per_s"] / m["scan_keys_per_s"], 2),
            "memkeys_keys_per_s_alone": base, "default_vs_memkeys_alone": round(d["scan_keys_per_s"] / base, 2)}
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    save_json(args.out, results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
