"""A 3-master Redis Cluster on loopback: the sweep reaches every master, through the read-only Lua path."""

from __future__ import annotations

import pytest
from kvg_redis import cluster_nodes

from kvguardian.keyspace.sweep import SweepOptions, sweep

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_cluster_sweep_covers_every_master(tmp_path):
    from redis.cluster import ClusterNode, RedisCluster

    nodes = cluster_nodes(tmp_path)
    try:
        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0].port)])
        for i in range(600):
            rc.set(f"order:{i}:state", "new")  # no TTL: spread over all slots
            rc.set(f"sess:{{u{i % 7}}}:{i}", "s", ex=600)  # hash tags
        rc.close()
        per_node = [n.client().dbsize() for n in nodes]
        assert all(k > 0 for k in per_node) and sum(per_node) == 1200
        for mode in ("lua", "pipeline"):
            result = sweep(nodes[1].url, SweepOptions(mode=mode, batch=100))
            assert result.complete and result.mode == mode
            assert result.server["cluster"] is True and len(result.server["nodes"]) == 3
            assert sorted(n["keys_scanned"] for n in result.server["nodes"]) == sorted(per_node)
            pats = {p["pattern"]: p for p in result.patterns}
            assert pats["order:{int}:state"]["keys"] == 600 and pats["order:{int}:state"]["no_ttl_keys"] == 600
            assert sum(p["keys"] for p in result.patterns) == 1200
    finally:
        for n in nodes:
            n.stop()
