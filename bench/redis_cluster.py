"""Benchmark: kv-guardian on a Redis Cluster (3 masters) against redis-cli run on every master, in one run.

    nice .venv/bin/python bench/redis_cluster.py                 # 1,000,000 keys over 3 masters
    nice .venv/bin/python bench/redis_cluster.py --keys 200000   # a quicker look

Starts a Redis Cluster of ``--masters`` cluster-enabled redis-servers on free loopback ports (``allkeys-lru``,
so the dumps carry idle times), loads ``--keys`` keys of bench/redis_scan.py's eight patterns, each key
written to the master owning its slot with ``redis-cli --pipe``, saves one ``dump.rdb`` per master, then
measures, interleaved, ``--reps`` times each (medians; the order turns every rep):

1. ``redis-cli --memkeys`` on every master at once (what ``redis-cli --cluster call`` would run, one
   process per master): the anchor; and ``redis-cli --bigkeys`` the same way;
2. ``kv-guardian redis scan`` on the cluster: one thread per master, mining in one forked child;
3. ``kv-guardian redis rdb`` on the per-master dumps: one reader process per file, mining in the parent;
   and the same files read in this one process (the anchor of the parallel read).

Per row: wall seconds, keys/s, client CPU seconds (this process and its children) and keys per client
CPU second (keys/s per core), server CPU per key (every master, INFO cpu). Ratios are against the
memkeys rows of the same reps. Writes ``bench/results/redis_cluster.json``. A shared 2-core VM runs the
masters, the client and the loader on the same two cores: throughput here is a floor.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from redis_scan import commands, free_port, pipe  # noqa: E402
from results_io import save_json  # noqa: E402


class Cluster:
    """``n`` redis-servers in ``workdir`` joined into one cluster; `stop` ends them by their handles."""

    def __init__(self, workdir: Path, n: int) -> None:
        missing = [tool for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]
        if missing:
            raise SystemExit(f"{', '.join(missing)} not installed; run ./scripts/setup.sh --services")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        self.dirs: list[Path] = []
        for i in range(n):
            port, d = free_port(), workdir / f"node{i}"
            d.mkdir(parents=True)
            self.procs.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--save", "",
                 "--appendonly", "no", "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                 "--cluster-config-file", str(d / "nodes.conf"), "--maxmemory-policy", "allkeys-lru",
                 "--logfile", str(d / "redis.log")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self.ports.append(port)
            self.dirs.append(d)
        self._wait(lambda c: c.ping())
        out = subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                              "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            raise SystemExit(f"redis-cli --cluster create failed: {out.stdout[-400:]} {out.stderr[-400:]}")
        self._wait(lambda c: c.cluster("INFO")["cluster_state"] == "ok")

    def client(self, i: int) -> Any:
        import redis

        return redis.Redis(port=self.ports[i], decode_responses=True)

    def _wait(self, ready: Callable[[Any], bool]) -> None:
        import redis

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if all(ready(self.client(i)) for i in range(len(self.ports))):
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise SystemExit("the cluster did not come up in 30 s")

    def load(self, n: int) -> dict[str, int]:
        """`redis_scan.commands` sent to the master owning each key's slot."""
        from redis.crc import key_slot

        owner: dict[int, int] = {}
        for lo, hi, *nodes in self.client(0).execute_command("CLUSTER", "SLOTS"):
            port = int(nodes[0][1])
            for slot in range(int(lo), int(hi) + 1):
                owner[slot] = self.ports.index(port)
        counts, chunks = commands(n)
        per_node: list[list[bytes]] = [[] for _ in self.ports]
        for key, cmd in chunks:
            per_node[owner[key_slot(key)]].append(cmd)
        del chunks
        for i, cmds in enumerate(per_node):
            pipe(self.ports[i], cmds)
        return counts

    def server_cpu(self) -> float:
        total = 0.0
        for i in range(len(self.ports)):
            info = self.client(i).info("cpu")
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return total

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def client_cpu() -> float:
    """CPU seconds of this process and of its waited-for children (redis-cli, reader and mining children)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(cluster: Cluster, run: Callable[[], int]) -> dict[str, Any]:
    """Wall and CPU cost of ``run`` (which returns the keys it saw)."""
    s0, c0, t0 = cluster.server_cpu(), client_cpu(), time.perf_counter()
    keys = run()
    dt, cpu = time.perf_counter() - t0, client_cpu() - c0
    return {"seconds": round(dt, 3), "keys": keys, "keys_per_s": round(keys / dt),
            "client_cpu_s": round(cpu, 3), "keys_per_cpu_s": round(keys / cpu) if cpu > 0 else None,
            "server_cpu_us_per_key": round((cluster.server_cpu() - s0) / max(keys, 1) * 1e6, 2)}


def redis_cli_all(cluster: Cluster, flag: str) -> int:
    """``redis-cli --memkeys`` (or ``--bigkeys``) on every master at once; keys sampled, all together."""
    procs = [subprocess.Popen(["redis-cli", "-p", str(p), flag], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) for p in cluster.ports]
    keys = 0
    for proc in procs:
        out, _ = proc.communicate()
        for line in out.splitlines():
            if line.startswith("Sampled ") and " keys in the keyspace" in line:
                keys += int(line.split()[1])
    return keys


def kvg_scan(cluster: Cluster) -> int:
    from kvguardian.keyspace.scan import ScanOptions, scan

    result = scan(f"redis://127.0.0.1:{cluster.ports[0]}/0", ScanOptions())
    if not result.complete or len(result.server["nodes"]) != len(cluster.ports):
        raise SystemExit(f"the scan did not cover the cluster: {result.incomplete_reason}")
    return result.keys_scanned


def kvg_rdb(dumps: list[Path], *, parallel: bool) -> int:
    from kvguardian.keyspace.rdb.scan import RdbSource, scan_rdbs

    files = [d.open("rb") for d in dumps]
    try:
        result = scan_rdbs([RdbSource(f, str(d), parallel=parallel) for f, d in zip(files, dumps)])
    finally:
        for f in files:
            f.close()
    if not result.complete:
        raise SystemExit(f"the RDB read did not finish: {result.incomplete_reason}")
    return result.keys_scanned


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0] if all(r[k] is not None for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--masters", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "redis_cluster.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvg-bench-cluster-"))
    cluster = Cluster(work, args.masters)
    try:
        t0 = time.perf_counter()
        counts = cluster.load(args.keys)
        load_s = time.perf_counter() - t0
        per_master = [cluster.client(i).dbsize() for i in range(args.masters)]
        for i in range(args.masters):
            cluster.client(i).save()
        dumps = [d / "dump.rdb" for d in cluster.dirs]
        runs: dict[str, Callable[[], int]] = {
            "memkeys_per_master": lambda: redis_cli_all(cluster, "--memkeys"),
            "bigkeys_per_master": lambda: redis_cli_all(cluster, "--bigkeys"),
            "kvg_scan_cluster": lambda: kvg_scan(cluster),
            "kvg_rdb_parallel": lambda: kvg_rdb(dumps, parallel=True),
            "kvg_rdb_one_process": lambda: kvg_rdb(dumps, parallel=False),
        }
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
        names = list(runs)
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                rows[name].append(timed(cluster, runs[name]))
                print(f"rep {rep} {name}: {rows[name][-1]}", file=sys.stderr)
        med = {name: _median(r) for name, r in rows.items()}
        anchor = med["memkeys_per_master"]
        data = {
            "bench": "redis_cluster", "keys": sum(per_master), "keys_per_master": per_master,
            "masters": args.masters, "reps": args.reps, "cpus": os.cpu_count(), "load_seconds": round(load_s, 1),
            "patterns": counts, "dump_bytes": [d.stat().st_size for d in dumps],
            "workers": {
                "memkeys_per_master": f"{args.masters} redis-cli processes (one per master)",
                "bigkeys_per_master": f"{args.masters} redis-cli processes (one per master)",
                "kvg_scan_cluster": f"{args.masters} threads (one per master) + 1 mining process",
                "kvg_rdb_parallel": f"{args.masters} reader processes (one per file) + 1 mining process",
                "kvg_rdb_one_process": "1 process",
            },
            "runs": rows, "median": med,
            "ratio_vs_memkeys": {name: {"keys_per_s": round(m["keys_per_s"] / anchor["keys_per_s"], 3),
                                        **({"keys_per_cpu_s": round(m["keys_per_cpu_s"] / anchor["keys_per_cpu_s"], 3)}
                                           if "keys_per_cpu_s" in m and "keys_per_cpu_s" in anchor else {})}
                                 for name, m in med.items()},
            "rdb_parallel_speedup": round(med["kvg_rdb_parallel"]["keys_per_s"]
                                          / med["kvg_rdb_one_process"]["keys_per_s"], 3),
        }
        print(save_json(args.out, data).read_text())
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
