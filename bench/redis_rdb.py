"""Benchmark: reading an RDB snapshot against ``redis-cli --memkeys`` on the same data, in one run.

    nice .venv/bin/python bench/redis_rdb.py                 # 1,000,000 keys (issue 18's setting)
    nice .venv/bin/python bench/redis_rdb.py --keys 100000   # a quicker look

Starts its own redis-server (``allkeys-lru``, so the snapshot carries idle times) on a free loopback port,
loads ``--keys`` keys of bench/redis_scan.py's eight patterns, saves ``dump.rdb``, then measures,
interleaved, ``--reps`` times each (medians):

1. ``redis-cli --memkeys`` (the anchor): keys/s, server CPU per key, redis-cli CPU per key;
2. ``kv-guardian redis rdb FILE`` (the reader in a forked child, mining in the parent) and the same in one
   process: keys/s, our CPU per key (parent + child), server CPU per key (none: the file is read, not the
   server);
3. ``kv-guardian redis scan --rdb URL``: the snapshot streamed through the replication handshake: keys/s,
   the server's main-thread CPU per key, and the CPU of the child the server forks to serialize the data;
4. peak memory of a one-process read of this file and of a file a tenth its size (flat in file size).

Times are wall clock (what the user waits) and CPU seconds (what the machine pays; robust when the machine
is shared). Writes ``bench/results/redis_rdb.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from redis_scan import free_port, load, memkeys  # noqa: E402
from results_io import save_json  # noqa: E402

# peak memory from VmHWM (this process's own address space: ru_maxrss would carry over the bench's, which
# held the whole load in memory when it forked)
ONE_PROCESS = ("import sys; from kvguardian.keyspace.rdb.scan import RdbSource, scan_rdb; "
               "r = scan_rdb(RdbSource(open(sys.argv[1], 'rb'), 'f', parallel=False)); "
               "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]; "
               "print(r.keys_scanned, hwm)")


def server_cpu(port: int) -> tuple[float, float]:
    """(main process, forked children) CPU seconds of the redis-server so far."""
    import redis

    info = redis.Redis(port=port).info("cpu")
    return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            float(info["used_cpu_user_children"]) + float(info["used_cpu_sys_children"]))


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(cmd: list[str], port: int, keys: int) -> dict[str, Any]:
    """Run ``cmd``; wall time, keys/s, and CPU per key of the command (incl. its children) and the server."""
    (s0, k0), c0 = server_cpu(port), children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    dt = time.perf_counter() - t0
    (s1, k1), c1 = server_cpu(port), children_cpu()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}): {proc.stderr[-400:]}")
    return {"seconds": round(dt, 3), "keys_per_s": round(keys / dt),
            "client_cpu_us_per_key": round((c1 - c0) / keys * 1e6, 3),
            "server_cpu_us_per_key": round((s1 - s0) / keys * 1e6, 3),
            "server_fork_cpu_us_per_key": round((k1 - k0) / keys * 1e6, 3), "stdout": proc.stdout}


def _kvg(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvguardian", *args]


def peak_rss_one_process(path: Path) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", ONE_PROCESS, str(path)], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.split()
    return int(out[0]), int(out[1])


def start_server(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir), "--maxmemory-policy", "allkeys-lru",
                             "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"],
                            stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc, port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "redis_rdb.json"))
    args = ap.parse_args()
    for binary in ("redis-server", "redis-cli"):
        if shutil.which(binary) is None:
            raise SystemExit(f"{binary} is not installed; run ./scripts/setup.sh --services")
    workdir = Path(tempfile.mkdtemp(prefix="kvg-bench-rdb-"))
    small_dir = workdir / "small"
    small_dir.mkdir()
    server, port = start_server(workdir)
    small, small_port = start_server(small_dir)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        import redis

        load(port, args.keys)
        redis.Redis(port=port, socket_timeout=600).save()
        load(small_port, max(1, args.keys // 10))
        redis.Redis(port=small_port, socket_timeout=600).save()
        rdb = workdir / "dump.rdb"
        runs: dict[str, list[dict[str, Any]]] = {"memkeys": [], "rdb_file": [], "rdb_file_one_process": [],
                                                  "scan_rdb_url": []}
        for rep in range(args.reps):
            order = list(runs) if rep % 2 == 0 else list(runs)[::-1]
            for name in order:
                if name == "memkeys":
                    row = memkeys(port)
                    row["server_fork_cpu_us_per_key"] = 0.0
                elif name == "rdb_file":
                    row = timed(_kvg("redis", "rdb", str(rdb), "--json", "--no-progress"), port, args.keys)
                elif name == "rdb_file_one_process":
                    row = timed([sys.executable, "-c", ONE_PROCESS, str(rdb)], port, args.keys)
                else:
                    row = timed(_kvg("redis", "scan", "--rdb", url, "--json", "--no-progress"), port, args.keys)
                row.pop("stdout", None)
                runs[name].append(row)
                print(name, json.dumps(row), file=sys.stderr)
        med = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0] if isinstance(rows[0][k], (int, float))}
               for name, rows in runs.items()}
        base = med["memkeys"]
        keys_small, rss_small = peak_rss_one_process(small_dir / "dump.rdb")
        keys_big, rss_big = peak_rss_one_process(rdb)
        result = {
            "keys": args.keys, "reps": args.reps, "rdb_bytes": rdb.stat().st_size,
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "load_average": os.getloadavg(),
                        "redis": subprocess.run(["redis-server", "--version"], capture_output=True,
                                                text=True).stdout.split()[2]},
            "runs": runs, "median": med,
            "ratios_vs_memkeys": {
                name: {"keys_per_s": round(m["keys_per_s"] / base["keys_per_s"], 2),
                       "total_cpu_per_key": round((m["client_cpu_us_per_key"] + m["server_cpu_us_per_key"]
                                                   + m["server_fork_cpu_us_per_key"])
                                                  / (base["client_cpu_us_per_key"] + base["server_cpu_us_per_key"]), 2)}
                for name, m in med.items() if name != "memkeys"},
            "memory": {"small_keys": keys_small, "small_peak_rss_kib": rss_small, "small_rdb_bytes":
                       (small_dir / "dump.rdb").stat().st_size, "big_keys": keys_big, "big_peak_rss_kib": rss_big,
                       "big_rdb_bytes": rdb.stat().st_size, "rss_ratio_big_vs_small": round(rss_big / rss_small, 2)},
        }
        result["targets"] = {
            "rdb_file_keys_per_s_ge_3x_memkeys": result["ratios_vs_memkeys"]["rdb_file"]["keys_per_s"] >= 3,
            "rdb_file_server_cpu_per_key_zero": med["rdb_file"]["server_cpu_us_per_key"] < 0.05,
        }
    finally:
        for p in (server, small):
            p.terminate()
            p.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    save_json(args.out, result)
    print(json.dumps({k: result[k] for k in ("median", "ratios_vs_memkeys", "memory", "targets")}, indent=2))


if __name__ == "__main__":
    main()
