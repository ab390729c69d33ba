"""Series one replica of a fleet exports, counted from real scrapes of kv-guardian's exporters (issue 29).

    PYTHONPATH=src .venv/bin/python bench/fleet_series.py [--requests 2000] [--redis-keys 20000] [--output F]

Starts, on 127.0.0.1, each exporter a replica (or a Redis shard) runs, serves it over HTTP and counts the
samples of ``GET /metrics`` per family, once at rest and once after traffic that would blow up an unbounded
exporter: ``--requests`` requests with distinct ids and tenants through a ledger and a paged pool (half of them
orphaned), and ``--redis-keys`` keys of 80 distinct key
patterns in a real redis-server (when ``redis-server`` is installed). The exporters:

- ``guard``: `KVGuardianCollector` over a ledger and one attached `PagedKVPool` (an HF/custom-model replica);
- ``oom_guard``: the ``kv-guardian oom-guard`` sidecar, its own process as in a pod, watching this process's
  memory cgroup with a 4 GiB limit (the one signal a CPU pod has; each GPU adds one ``nvml:N`` signal);
- ``watch``: ``kv-guardian watch vllm`` with a KV-event subscription (`WatchCollector`);
- ``redis``: ``kv-guardian redis exporter`` after one scan (one per Redis shard, not per replica).

The series of a replica are what its exporters export; Prometheus adds its target labels (instance, job, pod,
namespace, model) to each, which changes no count. vLLM's own ``vllm:*`` series and the in-process vLLM audit
(owner ``vllm``) are not started here (they need vLLM). Writes ``bench/results/fleet_series.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvguardian.core.exporters.server import Exporter, start_exporter

HERE = Path(__file__).resolve().parent
MARK = "q7z"  # in every request id and tenant the traffic uses: no label value may contain it
PATTERNS = 80  # distinct key patterns written to Redis: more than the exporter's --top (50)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def scrape(url: str) -> list[tuple[str, dict[str, str]]]:
    """Every sample of one ``GET url``: (sample name, labels)."""
    return [(s.name, dict(s.labels)) for fam in text_string_to_metric_families(fetch(url)) for s in fam.samples]


def counts(samples: list[tuple[str, dict[str, str]]]) -> dict[str, int]:
    """Series per sample name."""
    return dict(sorted(Counter(name for name, _ in samples).items()))


class Replica:
    """The exporters of one replica and one Redis shard, started on loopback; `traffic` loads them."""

    def __init__(self, redis_url: str | None, top: int = 50) -> None:
        from kvguardian.core.exporters.prometheus import KVGuardianCollector
        from kvguardian.core.ledger import Ledger
        from kvguardian.runtime.engines.watch import Watch
        from kvguardian.runtime.engines.watch_exporter import WatchCollector
        from kvguardian.runtime.paged import KVSpec, PagedKVPool

        self.ledger = Ledger()
        self.pool = PagedKVPool(num_blocks=4096, block_size=16, kv=KVSpec(num_layers=1, kv_heads=1, head_dim=4))
        self.collector = KVGuardianCollector(self.ledger, pools={"paged": self.pool})
        self.watch = Watch("vllm", "http://127.0.0.1:9/metrics", events="tcp://127.0.0.1:9", interval=3600)
        self.exporters: dict[str, Exporter] = {
            "guard": start_exporter(collector=self.collector, port=0),
            "watch": start_exporter(collector=WatchCollector(self.watch), port=0),
        }
        self.urls = {name: e.url for name, e in self.exporters.items()}
        self.redis: Any = None
        if redis_url is not None:
            from kvguardian.keyspace.exporter import Exporter as RedisExporter
            from kvguardian.keyspace.scan import ScanOptions

            self.redis = RedisExporter(redis_url, ScanOptions(), interval=3600, top=top)
            rhost, rport = self.redis.serve(0)
            self.urls["redis"] = f"http://{rhost}:{rport}/metrics"
        if self.redis is not None:
            self.redis.scan_once()
        self.sidecar = _Sidecar()  # last: nothing after it can fail and leave its process running
        self.urls["oom_guard"] = self.sidecar.url

    def traffic(self, requests: int, first: int = 0) -> list[str]:
        """``requests`` requests with distinct ids and tenants through the ledger and the pool, half of them
        left orphaned; returns every id and tenant used (none may become a label)."""
        used = []
        for i in range(first, first + requests):
            rid, tenant = f"req-{MARK}-{i:06d}", f"tenant-{MARK}-{i:06d}"
            used += [rid, tenant]
            info = self.ledger.begin_request(rid, tenant=tenant)
            self.ledger.add_entry(i, kind="block", nbytes=4096, request=info, source="bench")
            self.ledger.end_request(rid)
            if i % 2:
                self.ledger.release_entry(i)
            self.pool.open(rid, tenant=tenant)
            self.pool.append(rid, list(range(i % 50)))
            self.pool.free(rid)
        if self.redis is not None:
            self.redis.scan_once()
        return used

    def scrape_all(self) -> dict[str, list[tuple[str, dict[str, str]]]]:
        return {name: scrape(url) for name, url in sorted(self.urls.items())}

    def close(self) -> None:
        for e in self.exporters.values():
            e.close()
        self.sidecar.stop()
        self.watch.close()
        if self.redis is not None:
            self.redis.close()


class _Sidecar:
    """``kv-guardian oom-guard`` as a pod runs it (its own process, the cgroup signal with a memory limit),
    watching this process; its series do not depend on traffic (it admits nothing)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvguardian", "oom-guard", "--pid", str(os.getpid()), "--memory-limit-mb", "4096",
             "--port", str(port), "--interval", "0.5"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while True:
            try:
                if "kvguardian_memory_pressure_ratio" in urllib.request.urlopen(self.url, timeout=2).read().decode():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"kv-guardian oom-guard did not serve {self.url}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@contextlib.contextmanager
def redis_server(binary: str | None, keys: int) -> Iterator[tuple[str | None, list[str]]]:
    """A redis-server on a free loopback port holding ``keys`` keys of `PATTERNS` patterns (half without TTL);
    yields (url, key names) or (None, []) without a binary."""
    if binary is None or keys <= 0:
        yield None, []
        return
    import redis

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                 "no", "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client = redis.Redis(host="127.0.0.1", port=port)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"redis-server on port {port} did not start") from None
                    time.sleep(0.05)
            names = [":".join(["app"] * (1 + i % PATTERNS)) + f":{i}" for i in range(keys)]
            pipe = client.pipeline(transaction=False)
            for i, name in enumerate(names):
                pipe.set(name, "x" * 32, ex=3600 if i % 2 else None)
            pipe.execute()
            client.close()
            yield f"redis://127.0.0.1:{port}/0", names
        finally:
            proc.kill()
            proc.wait(10)


def measure(requests: int, redis_keys: int, redis_binary: str | None, *, top: int = 50,
            sizes: bool = False) -> dict[str, Any]:
    """The samples of every exporter at rest, after ``requests`` requests and after as many again (an
    exporter whose series grow with traffic differs between the last two), and every id, tenant and key name
    used (for the checks of the tests). ``top``: the Redis exporter's pattern cap (``--top``); ``sizes``: also
    the bytes of one exposition of each."""
    with redis_server(redis_binary, redis_keys) as (url, key_names):
        replica = Replica(url, top=top)
        try:
            at_rest = replica.scrape_all()
            used = replica.traffic(requests)
            loaded = replica.scrape_all()
            used += replica.traffic(requests, first=requests)
            loaded_twice = replica.scrape_all()
            size = {name: len(fetch(url).encode()) for name, url in replica.urls.items()} if sizes else {}
        finally:
            replica.close()
    return {"at_rest": at_rest, "loaded": loaded, "loaded_twice": loaded_twice, "used": used + key_names,
            "bytes": size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--redis-keys", type=int, default=20000)
    p.add_argument("-o", "--output", type=Path, default=HERE / "results" / "fleet_series.json")
    args = p.parse_args(argv)
    binary = shutil.which("redis-server")
    m = measure(args.requests, args.redis_keys, binary, sizes=True)
    per = {name: {"series_at_rest": sum(counts(m["at_rest"][name]).values()),
                  "series_after_traffic": sum(counts(m["loaded"][name]).values()),
                  "series_after_twice_the_traffic": sum(counts(samples).values()),
                  "exposition_bytes": m["bytes"][name],
                  "families": counts(samples)} for name, samples in m["loaded_twice"].items()}
    replica = sum(per[n]["series_after_twice_the_traffic"] for n in ("oom_guard", "watch") if n in per)
    from results_io import write_json

    write_json(args.output, {
        "requests": args.requests, "redis_keys": args.redis_keys if binary else 0,
        "exporters": per,
        "vllm_replica_sidecar_plus_watch": replica,
        "note": "Series counted from GET /metrics; Prometheus's target labels add no series. vLLM's own vllm:* "
                "series are not included.",
    })
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
