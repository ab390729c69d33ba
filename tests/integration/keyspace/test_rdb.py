"""RDB files written by the real Debian redis-server, read offline: every type, the three eviction policies,
the memory estimate against MEMORY USAGE SAMPLES 0, damaged files, and snapshots fetched over replication."""

from __future__ import annotations

import json
import random
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from kvg_redis import RedisProc, seed

from kvguardian.keyspace.rdb.reader import RdbReader
from kvguardian.keyspace.rdb.scan import RdbSource, scan_rdb
from kvguardian.keyspace.scan import ScanOptions, scan

pytestmark = pytest.mark.services

TYPES = ("string", "list", "set", "zset", "hash", "stream")


def _every_type(r) -> dict[str, str]:
    """Keys of every type and encoding Redis 7.0 saves; returns key -> type."""
    rnd = random.Random(3)
    p = r.pipeline(transaction=False)
    kinds: dict[str, str] = {}

    def put(key: str, kind: str) -> None:
        kinds[key] = kind

    for i in range(40):
        p.set(f"s:short:{i}", "v" * (i % 40)); put(f"s:short:{i}", "string")  # noqa: E702
        p.set(f"s:int:{i}", i * 977); put(f"s:int:{i}", "string")  # noqa: E702
        p.set(f"s:lzf:{i}", "abc" * (20 + i)); put(f"s:lzf:{i}", "string")  # noqa: E702 (compressible: LZF)
        p.set(f"s:raw:{i}", rnd.randbytes(300 + i)); put(f"s:raw:{i}", "string")  # noqa: E702
        p.set(f"s:ttl:{i}", "x", ex=3600); put(f"s:ttl:{i}", "string")  # noqa: E702
        p.rpush(f"l:{i}", *[f"e{j}" for j in range(i + 1)]); put(f"l:{i}", "list")  # noqa: E702
        p.sadd(f"si:{i}", *range(i + 1)); put(f"si:{i}", "set")  # noqa: E702 (intset)
        p.sadd(f"ss:{i}", *[f"m{j}" for j in range(i + 1)]); put(f"ss:{i}", "set")  # noqa: E702
        p.zadd(f"z:{i}", {f"m{j}": j / 3 for j in range(i + 1)}); put(f"z:{i}", "zset")  # noqa: E702
        p.hset(f"h:{i}", mapping={f"f{j}": f"v{j}" for j in range(i + 1)}); put(f"h:{i}", "hash")  # noqa: E702
        p.xadd(f"x:{i}", {"a": i, "b": "y" * i}); put(f"x:{i}", "stream")  # noqa: E702
    for i in range(3):  # past the listpack limits: quicklist of many nodes, hash tables, a skiplist
        p.rpush(f"L:{i}", *[f"element-{j}" for j in range(5000)]); put(f"L:{i}", "list")  # noqa: E702
        p.sadd(f"S:{i}", *[f"member-{j}" for j in range(700)]); put(f"S:{i}", "set")  # noqa: E702
        p.zadd(f"Z:{i}", {f"member-{j}": j for j in range(700)}); put(f"Z:{i}", "zset")  # noqa: E702
        p.hset(f"H:{i}", mapping={f"field-{j}": "v" * 80 for j in range(700)}); put(f"H:{i}", "hash")  # noqa: E702
        p.set(f"K:{'long-key-' * 20}{i}", "q"); put(f"K:{'long-key-' * 20}{i}", "string")  # noqa: E702
    p.execute()
    for i in range(3):  # streams with consumer groups, pending entries and many nodes
        key = f"X:{i}"
        for j in range(500):
            r.xadd(key, {"n": j, "payload": "p" * 30})
        r.xgroup_create(key, "g", id="0")
        r.xreadgroup("g", "c1", {key: ">"}, count=40)
        r.xreadgroup("g", "c2", {key: ">"}, count=7)
        kinds[key] = "stream"
    r.select(1)
    r.set("other-db:1", "x")
    r.select(0)
    return kinds


@pytest.fixture(params=["noeviction", "allkeys-lru", "allkeys-lfu"])
def saved(request, tmp_path):
    """A server under the policy with every type loaded and saved to dump.rdb; yields (server, kinds, path)."""
    proc = RedisProc(tmp_path / "srv", "--maxmemory-policy", request.param, "--maxmemory", "1gb")
    try:
        r = proc.client()
        kinds = _every_type(r)
        r.save()
        yield request.param, proc, kinds, proc.dir / "dump.rdb"
    finally:
        proc.stop()


def _read(path: Path) -> dict[bytes, tuple[int, int, int, int]]:
    out = {}
    with path.open("rb") as f:
        reader = RdbReader(f)
        for b in reader.batches():
            if b.db == 0:
                for k, t, s, e, i in zip(b.keys, b.types, b.sizes, b.expires, b.idles):
                    out[k] = (t, s, e, i)
    assert reader.done and reader.version == 10 and reader.aux["redis-ver"].startswith("7.")
    return out


def test_every_key_type_expiry_and_policy_opcodes(saved):
    policy, _proc, kinds, path = saved
    got = _read(path)
    assert {k.decode() for k in got} == set(kinds)
    for key, kind in kinds.items():
        t, size, expire, idle = got[key.encode()]
        assert TYPES[t] == kind, key
        assert size > 0
        assert (expire > 0) == key.startswith("s:ttl:"), key
        if policy == "noeviction":
            assert idle == -1
        else:
            assert idle >= 0  # IDLE seconds under LRU, the FREQ counter under LFU


def test_scan_result_matches_a_live_scan(saved):
    policy, proc, kinds, path = saved
    with path.open("rb") as f:
        offline = scan_rdb(RdbSource(f, str(path)), db=0)
    live = scan(proc.url, ScanOptions(nice=0))
    assert offline.complete and offline.keys_scanned == live.keys_scanned == len(kinds)
    assert offline.idle_metric == ("freq" if policy == "allkeys-lfu" else "idletime")
    pat_off = {p["pattern"]: (p["keys"], p["types"], p["ttl"]["none"]) for p in offline.patterns}
    pat_live = {p["pattern"]: (p["keys"], p["types"], p["ttl"]["none"]) for p in live.patterns}
    assert pat_off == pat_live
    assert (policy == "noeviction") == any("no idle times" in w for w in offline.warnings)
    data = offline.to_dict()  # the live scan's schema: redis diff reads it
    assert data["schema"] == "kv-guardian/redis-scan" and data["mode"] == "rdb"
    assert data["server"]["rdb"]["databases"] == {"0": len(kinds)}
    assert data["server"]["rdb"]["checksum"] == "ok"  # the trailing CRC64 matched


def test_size_estimate_against_memory_usage_samples_0(saved):
    """Per type, the estimate's ratio to MEMORY USAGE SAMPLES 0 (exact) of the server that wrote the file."""
    _policy, proc, _kinds, path = saved
    got = _read(path)
    r = proc.client()
    ratios: dict[str, list[float]] = defaultdict(list)
    for key, (_, size, _, _) in got.items():
        ratios[r.object("encoding", key).decode()].append(size / r.memory_usage(key, samples=0))
    med = {enc: statistics.median(v) for enc, v in ratios.items()}
    for enc, m in med.items():
        assert 0.85 <= m <= 1.1, (enc, m, med)
    flat = sorted(x for v in ratios.values() for x in v)
    assert 0.95 <= statistics.median(flat) <= 1.05


def _rdb_bytes(tmp_path: Path) -> bytes:
    proc = RedisProc(tmp_path / "dmg", "--maxmemory-policy", "allkeys-lru")
    try:
        seed(proc.client(), scale=3)
        proc.client().save()
        return (proc.dir / "dump.rdb").read_bytes()
    finally:
        proc.stop()


def test_truncated_and_corrupt_files_give_a_partial_result_and_one_error_line(tmp_path, kv_cli):
    data = _rdb_bytes(tmp_path)
    with (tmp_path / "whole.rdb").open("wb") as f:
        f.write(data)
    rc, out, err = kv_cli("redis", "rdb", str(tmp_path / "whole.rdb"), "--json", "--fail-on", "never")
    whole = json.loads(out)
    assert rc == 0 and whole["complete"] and whole["keys_scanned"] == 2460, err  # seed(scale=3)
    cut = tmp_path / "cut.rdb"
    cut.write_bytes(data[: len(data) * 2 // 3])
    bad = tmp_path / "bad.rdb"
    mangled = bytearray(data)
    at = len(data) // 2
    mangled[at:at + 64] = b"\xf1" * 64  # no such record type
    bad.write_bytes(bytes(mangled))
    for path in (cut, bad):
        rc, out, err = kv_cli("redis", "rdb", str(path), "--json")
        part = json.loads(out)
        assert rc == 2 and not part["complete"] and "Traceback" not in err
        assert part["incomplete_reason"].startswith("damaged or truncated RDB at byte")
        assert 0 < part["keys_scanned"] < whole["keys_scanned"] and part["patterns"]
        assert err.count("\n") == 1 and "partial" in err and "at byte" in err
    (tmp_path / "text.rdb").write_text("not an rdb\n")
    rc, out, err = kv_cli("redis", "rdb", str(tmp_path / "text.rdb"))
    assert rc == 2 and "not an RDB file" in err and err.count("\n") == 1 and not out
    assert "text.rdb" in err and "fix: " in err  # which file, and what to pass instead
    rc, out, err = kv_cli("redis", "rdb", str(tmp_path / "missing.rdb"))
    assert rc == 2 and "cannot read RDB file" in err and err.count("\n") == 1


@pytest.mark.parametrize("diskless", ["yes", "no"])
def test_scan_rdb_fetches_a_snapshot_through_replication(tmp_path, kv_cli, diskless):
    proc = RedisProc(tmp_path / "repl", "--repl-diskless-sync", diskless, "--repl-diskless-sync-delay", "0")
    try:
        r = proc.client()
        seed(r)
        rc, out, err = kv_cli("redis", "scan", "--rdb", proc.url, "--json", "--fail-on", "never")
        data = json.loads(out)
        assert rc == 0 and data["complete"] and data["keys_scanned"] == r.dbsize(), err
        assert ("diskless" in data["mode_reason"]) == (diskless == "yes")
        assert data["server"]["rdb"]["checksum"] == "ok"
        r.execute_command("ACL", "SETUSER", "ro", "on", ">pw", "~*", "+scan", "+type")
        url = proc.url.replace("redis://", "redis://ro:pw@")
        rc, out, err = kv_cli("redis", "scan", "--rdb", url)
        assert rc == 3 and "+sync +replconf" in err and "pw@" not in err and err.count("\n") == 1
    finally:
        proc.stop()


def test_a_byte_changed_inside_a_value_fails_the_crc64(tmp_path, kv_cli):
    """A damaged byte the records cannot show (inside a string) is caught by the file's CRC64: the result
    is incomplete, and says so."""
    proc = RedisProc(tmp_path / "crc")
    try:
        rnd = random.Random(9)
        value = "".join(rnd.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(300))  # incompressible: stored raw
        r = proc.client()
        r.set("payload:1", value)
        r.set("payload:2", "x")
        r.save()
        data = bytearray((proc.dir / "dump.rdb").read_bytes())
    finally:
        proc.stop()
    at = data.find(value.encode()) + 100
    data[at] = ord("a")  # still a byte of a string: every record reads as before
    path = tmp_path / "flipped.rdb"
    path.write_bytes(bytes(data))
    rc, out, err = kv_cli("redis", "rdb", str(path), "--json")
    part = json.loads(out)
    assert not part["complete"] and "CRC64" in part["incomplete_reason"] and part["keys_scanned"] == 2
    assert part["server"]["rdb"]["checksum"] == "mismatch" and rc == 2 and "Traceback" not in err


def test_databases_of_a_snapshot_the_url_and_db_options_pick(tmp_path, kv_cli):
    """``redis scan --rdb URL/N`` keeps database N; ``redis rdb --db N`` of a database the file lacks says
    which it has; a negative --db is refused."""
    proc = RedisProc(tmp_path / "dbs")
    try:
        r = proc.client()
        r.set("zero:1", "x")
        r.select(1)
        for i in range(3):
            r.set(f"one:{i}", "x")
        r.select(0)
        rc, out, err = kv_cli("redis", "scan", "--rdb", proc.url.rsplit("/", 1)[0] + "/1", "--json",
                              "--fail-on", "never")
        data = json.loads(out)
        assert rc == 0 and data["keys_scanned"] == 3 and data["server"]["rdb"]["db"] == 1, err
        r.save()
        rc, out, err = kv_cli("redis", "rdb", str(proc.dir / "dump.rdb"), "--db", "7", "--json")
        data = json.loads(out)
        said = " ".join(data["warnings"])
        assert data["keys_scanned"] == 0 and "no keys of database 7" in said and "0, 1" in said
        rc, out, err = kv_cli("redis", "rdb", str(proc.dir / "dump.rdb"), "--db", "-1")
        assert rc == 2 and "database number" in err and "Traceback" not in err
    finally:
        proc.stop()


def test_cold_keys_are_found_offline_too(tmp_path):
    """KVG301 from a snapshot's IDLE records, as a live scan finds it."""
    import time

    from kvguardian.keyspace.verdicts import scan_findings

    proc = RedisProc(tmp_path / "cold", "--maxmemory-policy", "allkeys-lru", "--maxmemory", "1gb")
    try:
        r = proc.client()
        for i in range(40):  # past collapse_after: one stale:{int} pattern
            r.set(f"stale:{i}", "x")
        time.sleep(2.2)  # IDLE is kept in seconds
        r.save()
        opts = ScanOptions(cold_after=1)
        with (proc.dir / "dump.rdb").open("rb") as f:
            offline = scan_rdb(RdbSource(f, "dump.rdb"), opts)
        live = scan(proc.url, ScanOptions(cold_after=1, nice=0))
    finally:
        proc.stop()
    assert [f.id for f in scan_findings(offline)] == [f.id for f in scan_findings(live)] == ["KVG301"]
