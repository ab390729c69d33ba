"""Cluster topology from CLUSTER NODES text, and the merge of per-shard dumps into one result (hand-built RDBs,
read in this process): a pattern split over shards is one pattern with summed keys and bytes."""

from __future__ import annotations

import io

from kvg_rdb_files import rdb, st

from kvguardian.keyspace.cluster import choose, parse_nodes, shards
from kvguardian.keyspace.rdb.scan import RdbSource, scan_rdb, scan_rdbs

NODES = """\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b1 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922 [10923->-c1]
c1 127.0.0.1:7003@17003 master,fail - 0 0 3 disconnected 10923-16383
d1 127.0.0.1:7004@17004 slave a1 0 0 1 connected
e1 127.0.0.1:7005@17005 slave,fail? b1 0 0 2 connected
f1 127.0.0.1:7006@17006 slave c1 0 0 3 connected
g1 :7007@17007 master - 0 0 0 connected
"""


def test_one_shard_per_slot_serving_master_with_its_replicas():
    nodes = parse_nodes(NODES, "10.0.0.9")
    assert [n.slots for n in nodes[:3]] == [5461, 5462, 5461]  # a migration marker is not a slot
    assert nodes[-1].addr == "10.0.0.9:7007" and nodes[-1].slots == 0
    found = shards(nodes)
    assert [s.master.addr for s in found] == ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
    assert [[r.addr for r in s.replicas] for s in found] == [["127.0.0.1:7004"], ["127.0.0.1:7005"],
                                                             ["127.0.0.1:7006"]]


def test_masters_or_replicas_are_chosen_and_the_shards_left_out_named():
    found = shards(parse_nodes(NODES, "127.0.0.1"))
    picked, problems = choose(found, replicas=False)
    assert [n.addr for n in picked] == ["127.0.0.1:7001", "127.0.0.1:7002"]
    assert problems == ["master 127.0.0.1:7003 (5461 slots) is marked fail: its keys were not read"]
    picked, problems = choose(found, replicas=True)
    assert [n.addr for n in picked] == ["127.0.0.1:7004", "127.0.0.1:7006"]  # 7005 is failing: not read
    assert len(problems) == 1 and problems[0].startswith("master 127.0.0.1:7002 (5462 slots) has no healthy replica")


def _dump(lo: int, hi: int, extra: bytes = b"") -> bytes:
    """A shard's dump: upload:<n> keys lo..hi-1 (no TTL) and one config key of its own."""
    return rdb(*(b"\x00" + st(f"upload:{i:08x}{'ab' * 12}") + st("u" * 100) for i in range(lo, hi)),
               b"\x00" + st(f"config:shard{lo}") + st("on"), extra)


def test_per_shard_dumps_merge_into_the_patterns_of_one_dump():
    whole = scan_rdb(RdbSource(io.BytesIO(rdb(*(b"\x00" + st(f"upload:{i:08x}{'ab' * 12}") + st("u" * 100)
                                                for i in range(300)),
                                              *(b"\x00" + st(f"config:shard{lo}") + st("on") for lo in (0, 100, 250)))),
                               "all"))
    parts = [(0, 100), (100, 250), (250, 300)]
    merged = scan_rdbs([RdbSource(io.BytesIO(_dump(lo, hi)), f"s{lo}") for lo, hi in parts])
    assert merged.complete and merged.target == "s0, s100, s250"
    shape = lambda r: sorted((p["pattern"], p["keys"], p["bytes"], p["no_ttl_keys"]) for p in r.patterns)  # noqa: E731
    assert shape(merged) == shape(whole)
    upload = [p for p in merged.patterns if p["pattern"].startswith("upload:")]
    assert len(upload) == 1 and upload[0]["keys"] == 300
    nodes = merged.server["nodes"]
    assert [(n["addr"], n["keys_scanned"]) for n in nodes] == [("s0", 101), ("s100", 151), ("s250", 51)]
    assert sum(n["bytes"] for n in nodes) == merged.bytes == whole.bytes
    assert [f["file"] for f in merged.server["rdb"]["files"]] == ["s0", "s100", "s250"]
    assert merged.server["rdb"]["databases"] == {"0": 303}


def test_a_damaged_dump_ends_alone_and_the_others_are_counted():
    bad = _dump(100, 250)
    bad = bad[: len(bad) // 2]  # truncated
    res = scan_rdbs([RdbSource(io.BytesIO(_dump(0, 100)), "s0"), RdbSource(io.BytesIO(bad), "s1"),
                     RdbSource(io.BytesIO(_dump(250, 300)), "s2")])
    assert not res.complete
    assert res.incomplete_reason.startswith("damaged or truncated RDB s1 at byte ")
    assert res.incomplete_reason.endswith("the keys of the other 2 files are counted")
    rows = {n["addr"]: n for n in res.server["nodes"]}
    assert rows["s0"]["keys_scanned"] == 101 and rows["s2"]["keys_scanned"] == 51 and rows["s0"]["error"] is None
    assert 0 < rows["s1"]["keys_scanned"] < 151 and rows["s1"]["error"] is not None
    assert res.keys_scanned == sum(n["keys_scanned"] for n in rows.values())
