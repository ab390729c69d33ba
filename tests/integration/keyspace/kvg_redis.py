"""Real redis-server processes for the key-space tests, started on free loopback ports (never mocked).

Test files import these helpers as ``kvg_redis`` (pytest puts this folder on sys.path); the fixtures that
use them are in this folder's conftest.py.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

redis = pytest.importorskip("redis")


from kvg_testing import IN_CI, free_port, require_binary  # noqa: E402,F401 - re-exported to the tests


class RedisProc:
    """One redis-server on 127.0.0.1:port with its own directory; restartable on the same port."""

    def __init__(self, workdir: Path, *extra: str, port: int | None = None) -> None:
        self.binary = require_binary("redis-server")
        self.port = port or free_port()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "no", "--logfile", str(self.dir / "redis.log"), *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    return
            except (redis.ConnectionError, redis.ResponseError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server on port {self.port} did not start: {log}") from None
                time.sleep(0.05)

    def client(self, **kw: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10, **kw)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()


#: pattern -> (keys, TTL seconds or None, type): what `seed` writes
SEED = {
    "session:{uuid}": (300, 3600, "string"),
    "user:{int}:profile": (200, None, "hash"),
    "tmp_{ts_ns}": (150, None, "string"),
    "cache:{hex}": (100, 600, "string"),
    "feed:{int}": (60, None, "list"),
    "config:{str}": (30, None, "string"),
}
CONFIG_NAMES = [f"flag{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(30)]


def seed(r: redis.Redis, *, rnd: random.Random | None = None, scale: int = 1) -> None:
    rnd = rnd or random.Random(5)
    p = r.pipeline(transaction=False)
    for _ in range(300 * scale):
        p.set(f"session:{uuid.UUID(int=rnd.getrandbits(128))}", "s" * 40, ex=3600)
    for i in range(200 * scale):
        p.hset(f"user:{1000 + i}:profile", mapping={"name": f"n{i}", "plan": "free"})
    for i in range(150 * scale):
        p.set(f"tmp_{1_712_345_678_000_000_000 + i * 7919}", "t" * 20)
    for _ in range(100 * scale):
        p.set(f"cache:{rnd.getrandbits(160):040x}", "c" * 64, ex=600)
    for i in range(60 * scale):
        p.rpush(f"feed:{i}", *[f"item{j}" for j in range(5)])
    for name in CONFIG_NAMES:
        p.set(f"config:{name}", "on")
    p.execute()


def touch_hot(r: redis.Redis) -> None:
    """Read the config keys so they are hot (idle 0) while the rest is cold."""
    p = r.pipeline(transaction=False)
    for name in CONFIG_NAMES:
        p.get(f"config:{name}")
    p.execute()


@contextlib.contextmanager
def keep_hot(r: redis.Redis) -> Iterator[None]:
    """Read the config keys every 0.2 s while the block runs, so they stay hot however slow the machine is."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            touch_hot(r)
            stop.wait(0.2)

    touch_hot(r)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)


def cluster_nodes(tmp: Path, n: int = 3, *, replicas: int = 0) -> list[RedisProc]:
    """``n`` masters (and ``replicas`` replicas each) of one Redis Cluster, joined by redis-cli --cluster create
    and waited for: cluster_state ok everywhere, every replica's link to its master up. Masters come first."""
    cli = require_binary("redis-cli")
    nodes: list[RedisProc] = []
    try:
        for i in range(n * (1 + replicas)):
            bus = free_port()
            nodes.append(RedisProc(tmp / f"node{i}", "--cluster-enabled", "yes", "--cluster-config-file",
                                   str(tmp / f"node{i}" / "nodes.conf"), "--cluster-port", str(bus),
                                   "--cluster-node-timeout", "5000"))
        addrs = [f"127.0.0.1:{node.port}" for node in nodes]
        out = subprocess.run([cli, "--cluster", "create", *addrs, "--cluster-replicas", str(replicas),
                              "--cluster-yes"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(_settled(node) for node in nodes):
                return sorted(nodes, key=lambda node: node.client().info("replication")["role"] != "master")
            time.sleep(0.1)
        raise RuntimeError("cluster did not reach cluster_state:ok with every replica linked")
    except BaseException:
        for node in nodes:  # never leave servers behind
            node.stop()
        raise


def _settled(node: RedisProc) -> bool:
    c = node.client()
    if str(c.cluster("INFO").get("cluster_state")) not in ("ok", "b'ok'"):
        return False
    repl = c.info("replication")
    return repl["role"] == "master" or repl.get("master_link_status") == "up"


def cmdstats(node: RedisProc) -> dict[str, int]:
    """Calls per command on ``node`` (INFO commandstats; the INFO that reads them counts too)."""
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in node.client().info("commandstats").items()}
