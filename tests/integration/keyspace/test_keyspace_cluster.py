"""A real Redis Cluster on loopback (3 masters + 1 replica each, Debian's redis-server): the scan walks every
shard in parallel, merges patterns, never writes, reads replicas when asked; a lost shard gives one line and
the others' result; per-shard RDB dumps read together give the scan's patterns."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvg_redis import RedisProc, cluster_nodes, cmdstats

from kvguardian.keyspace.scan import ScanOptions, scan

pytestmark = [pytest.mark.services, pytest.mark.slow]

LEAK = "upload:{uuid}"  # no TTL, unique names: the leak, spread over every shard
LEAK_KEYS = 900
#: what a scan may send to a node; anything else (a write above all) fails the read-only test
READ_ONLY = {"scan", "evalsha_ro", "eval_ro", "type", "memory|usage", "pttl", "object|idletime", "object|freq",
             "time", "info", "dbsize", "ping", "cluster|nodes", "readonly", "client|setinfo", "hello", "select"}
REPLICATION = {"replconf"}  # a replica's acks to its master, every second: not ours
PROBES = {"scan", "evalsha_ro", "eval_ro", "type", "memory|usage", "pttl", "object|idletime"}


def _fill(port: int) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port)])
    try:
        p = rc.pipeline()
        for i in range(LEAK_KEYS):
            p.set(f"upload:{uuid.UUID(int=i * 7919 + 1)}", "u" * 100)
        for i in range(600):
            p.set(f"order:{i}:state", "new")
            p.set(f"sess:{{u{i % 7}}}:{i}", "s", ex=600)  # hash tags: a few slots only
        for i in range(60):
            p.hset(f"user:{i}:profile", mapping={"name": f"n{i}", "plan": "free"})
        p.execute()
    finally:
        rc.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisProc]]:
    """3 masters then their 3 replicas, filled, every write replicated."""
    nodes = cluster_nodes(tmp_path_factory.mktemp("cluster"), 3, replicas=1)
    try:
        _fill(nodes[0].port)
        for m in nodes[:3]:
            m.client().execute_command("WAIT", 1, 5000)
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def _scan(kv_cli, url: str, tmp_path: Path, *extra: str) -> tuple[int, dict, str, str]:
    """Exit code, the JSON result, stdout and stderr."""
    out = tmp_path / f"scan-{uuid.uuid4().hex[:6]}.json"
    rc, shown, err = kv_cli("redis", "scan", url, "-o", str(out), "--fail-on", "never", "--no-progress", *extra)
    return rc, (json.loads(out.read_text()) if out.exists() else {}), shown, err


def _memory(node: RedisProc, match: str) -> int:
    c = node.client()
    return sum(int(c.memory_usage(k) or 0) for k in c.scan_iter(match=match, count=500))


def test_a_leak_spread_over_every_shard_is_one_pattern_with_its_summed_size(cluster, kv_cli, tmp_path):
    masters = cluster[:3]
    per_shard = [m.client().dbsize() for m in masters]
    leak_per_shard = [sum(1 for _ in m.client().scan_iter(match="upload:*", count=500)) for m in masters]
    assert all(n > 0 for n in leak_per_shard) and sum(leak_per_shard) == LEAK_KEYS
    rc, data, shown, err = _scan(kv_cli, cluster[4].url, tmp_path)  # any node will do: here a replica
    assert rc == 0, err
    assert data["complete"] is True and data["server"]["cluster"] is True and data["server"]["shards"] == 3
    assert data["server"]["read_from"] == "masters"
    nodes = data["server"]["nodes"]
    assert sorted(n["addr"] for n in nodes) == sorted(f"127.0.0.1:{m.port}" for m in masters)
    assert sorted(n["keys_scanned"] for n in nodes) == sorted(per_shard)
    assert sum(n["bytes"] for n in nodes) == data["bytes"]
    leak = [p for p in data["patterns"] if p["pattern"] == LEAK]
    assert len(leak) == 1 and leak[0]["keys"] == LEAK_KEYS and leak[0]["no_ttl_keys"] == LEAK_KEYS
    assert leak[0]["bytes"] == sum(_memory(m, "upload:*") for m in masters)
    assert [f["evidence"]["pattern"] for f in data["findings"] if f["id"] == "KVG302"] == [LEAK]
    assert sum(p["keys"] for p in data["patterns"]) == sum(per_shard)
    table = shown[shown.index("per shard"):]  # the console output names every shard with its keys
    assert all(f"127.0.0.1:{m.port}" in table and f"{n:,}" in table for m, n in zip(masters, per_shard))


def test_the_scan_never_writes_on_any_node(cluster, tmp_path):
    before = [(cmdstats(n), n.client().info("persistence")["rdb_changes_since_last_save"]) for n in cluster]
    for mode in ("lua", "pipeline"):
        result = scan(cluster[0].url, ScanOptions(mode=mode, batch=100, nice=0))
        assert result.complete and result.keys_scanned == sum(m.client().dbsize() for m in cluster[:3])
    for node, (stats, dirty) in zip(cluster, before):
        after = cmdstats(node)
        called = {c for c, n in after.items() if n > stats.get(c, 0)} - REPLICATION
        assert called <= READ_ONLY, f"{node.port}: {called - READ_ONLY}"
        assert node.client().info("persistence")["rdb_changes_since_last_save"] == dirty


def test_replicas_mode_reads_the_replicas_only(cluster, kv_cli, tmp_path):
    masters, replicas = cluster[:3], cluster[3:]
    before = [cmdstats(n) for n in cluster]
    rc, data, _, err = _scan(kv_cli, cluster[0].url, tmp_path, "--replicas")
    assert rc == 0, err
    assert data["server"]["read_from"] == "replicas" and data["complete"] is True
    assert sorted(n["addr"] for n in data["server"]["nodes"]) == sorted(f"127.0.0.1:{r.port}" for r in replicas)
    assert all(n["role"] == "slave" for n in data["server"]["nodes"])
    assert data["keys_scanned"] == sum(m.client().dbsize() for m in masters)
    probed = [{c for c, n in cmdstats(node).items() if n > old.get(c, 0)} & PROBES for node, old in
              zip(cluster, before)]
    assert probed[:3] == [set(), set(), set()], probed  # no master was scanned
    assert all("scan" in p or "evalsha_ro" in p for p in probed[3:]), probed
    assert any("KVG301" in w for w in data["warnings"])  # idle times on a replica: said so


def test_a_shard_lost_mid_walk_or_down_gives_one_line_and_the_other_shards(tmp_path, kv_cli):
    nodes = cluster_nodes(tmp_path / "c", 3)
    try:
        _fill(nodes[0].port)
        kept = [n.client().dbsize() for n in nodes[:2]]

        def kill_at_300(done: int, total: int) -> None:
            if done >= 300:
                nodes[2].stop()  # mid-walk: its lane meets a closed connection, the others go on

        result = scan(nodes[0].url, ScanOptions(batch=20, nice=0), progress=kill_at_300)
        assert not result.complete and result.incomplete_reason.startswith("connection lost to 1 of 3 shards")
        rows = {n["addr"]: n for n in result.server["nodes"]}
        lost = rows[f"127.0.0.1:{nodes[2].port}"]
        assert lost["error"] and lost["keys_scanned"] < lost["dbsize"]
        assert sorted(r["keys_scanned"] for r in rows.values() if r is not lost) == sorted(kept)
        rc, data, _, err = _scan(kv_cli, nodes[0].url, tmp_path)
        assert rc == 3, err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in err, err
        assert f"127.0.0.1:{nodes[2].port}" in lines[0] and "connection lost to 1 of 3 shards" in lines[0]
        assert data["complete"] is False and data["keys_scanned"] == sum(kept)
        assert sorted(n["keys_scanned"] for n in data["server"]["nodes"]) == sorted(kept)
        assert [p["keys"] for p in data["patterns"] if p["pattern"] == LEAK] == [
            sum(sum(1 for _ in n.client().scan_iter(match="upload:*")) for n in nodes[:2])]
    finally:
        for n in nodes:
            n.stop()


def test_rdb_over_the_per_shard_dumps_equals_the_merged_scan(cluster, kv_cli, tmp_path):
    rc, scanned, _, err = _scan(kv_cli, cluster[0].url, tmp_path)
    assert rc == 0, err
    dumps = []
    for m in cluster[:3]:
        m.client().save()  # the test takes the dumps; kv-guardian only reads them
        dumps.append(str(m.dir / "dump.rdb"))
    out = tmp_path / "rdb.json"
    rc, _, err = kv_cli("redis", "rdb", *dumps, "-o", str(out), "--fail-on", "never", "--no-progress")
    assert rc == 0, err
    offline = json.loads(out.read_text())
    assert offline["complete"] is True and offline["mode"] == "rdb"
    assert [n["addr"] for n in offline["server"]["nodes"]] == dumps
    assert len(offline["server"]["rdb"]["files"]) == 3 and offline["server"]["rdb"]["checksum"] == "ok"
    shape = lambda d: sorted((p["pattern"], p["keys"], p["no_ttl_keys"]) for p in d["patterns"])  # noqa: E731
    assert shape(offline) == shape(scanned)
    assert sorted(n["keys_scanned"] for n in offline["server"]["nodes"]) == sorted(
        n["keys_scanned"] for n in scanned["server"]["nodes"])
    assert [f["evidence"]["pattern"] for f in offline["findings"] if f["id"] == "KVG302"] == [LEAK]


@pytest.mark.parametrize("mode", ["lua", "pipeline"])
def test_keys_of_another_shard_answer_moved_and_count_as_vanished(cluster, mode):
    from kvguardian.keyspace.connect import connect
    from kvguardian.keyspace.probe import Lane

    foreign = list(cluster[1].client().scan_iter(match="order:*", count=100))[:5]
    client = connect(cluster[0].url)
    client.script_flush()  # the script is reloaded on the way (NOSCRIPT), and fails on these keys
    lane = Lane(client, "node0", mode=mode, sub="IDLETIME", batch=10, match=None)
    try:
        lane.send(foreign, scan=False)
        keys, probe, _ = lane.receive()
    finally:
        lane.close()
    assert keys == foreign and probe is not None and (probe[:, 0] == -1).all()
    assert lane.moved == len(foreign)
