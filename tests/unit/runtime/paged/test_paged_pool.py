import numpy as np
import pytest

from kvguardian.core.errors import UsageError
from kvguardian.runtime.paged import METRIC_KEYS, KVSpec, PagedKVPool, PoolExhausted, TableState

BS = 4


def pool(n=16, **kw):
    kw.setdefault("debug", True)
    kw.setdefault("on_fault", "raise")
    return PagedKVPool(n, BS, **kw)


def test_append_maps_tokens_to_slots_block_by_block():
    p = pool()
    p.open("a", "acme")
    slots = p.append("a", list(range(10)))
    blocks = p.block_ids("a")
    assert len(blocks) == 3
    assert slots.tolist() == [int(blocks[i // BS]) * BS + i % BS for i in range(10)]
    assert p.filled[blocks].tolist() == [4, 4, 2]
    more = p.append("a", [10, 11, 12])
    assert p.block_ids("a").tolist() == [*blocks.tolist(), int(p.block_ids("a")[3])]
    assert more.tolist()[:2] == [int(blocks[2]) * BS + 2, int(blocks[2]) * BS + 3]
    assert p.table("a").num_tokens == 13
    assert p.check_invariants() == []


def test_prefix_is_shared_within_a_tenant_and_never_across():
    p = pool()
    prompt = list(range(9))
    p.open("a", "acme")
    p.append("a", prompt)
    p.open("b", "acme")
    assert p.match_prefix("b", prompt) == 8  # two full blocks, the last token is always computed
    assert p.block_ids("b").tolist() == p.block_ids("a")[:2].tolist()
    assert p.blocks.ref[p.block_ids("b")].tolist() == [2, 2]
    p.open("c", "globex")
    assert p.match_prefix("c", prompt) == 0
    assert p.check_invariants() == []


def test_shared_namespace_is_opt_in_for_every_tenant():
    p = pool()
    prompt = list(range(9))
    p.open("a", "acme", shared="sys")
    p.append("a", prompt)
    p.open("b", "globex", shared="sys")
    assert p.match_prefix("b", prompt) == 8
    p.open("c", "globex")  # globex's own namespace: not opted in for this request
    assert p.match_prefix("c", prompt) == 0
    p.open("d", "acme")
    assert p.match_prefix("d", prompt) == 0
    assert p.check_invariants() == []


def test_hashes_chain_over_parent_and_extra_keys():
    p = pool()
    p.open("a", "acme", extra_keys=("lora-1",))
    p.append("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    p.open("b", "acme")
    assert p.match_prefix("b", [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 0  # different extra keys
    p.open("c", "acme", extra_keys=("lora-1",))
    assert p.match_prefix("c", [9, 9, 9, 9, 5, 6, 7, 8, 1]) == 0  # same 2nd block, different parent
    p.open("d", "acme", extra_keys=("lora-1",))
    assert p.match_prefix("d", [1, 2, 3, 4, 5, 6, 7, 8, 0]) == 8
    with pytest.raises(UsageError, match="extra key"):
        p.open("e", "acme", extra_keys=(1.5,))


def test_free_returns_tail_first_uncached_to_the_front_cached_to_the_back():
    p = pool(8)
    p.open("a", "acme")
    p.append("a", list(range(10)))  # blocks 0, 1 full (cached), 2 partial
    p.free("a")
    q = p.blocks.queue.live_ids().tolist()
    assert q[0] == 2  # the uncached tail block is reused first
    assert q[-2:] == [1, 0]  # cached blocks at the back, the request's tail evicted first
    assert p.blocks.num_available == 8
    m = p.metrics()
    assert (m["blocks_free"], m["blocks_cached"], m["blocks_referenced"]) == (6, 2, 0)


def test_unreferenced_cached_blocks_are_evicted_lru_when_needed():
    p = pool(4, debug=False)
    p.open("a", "acme")
    p.append("a", list(range(8)))  # 2 full blocks, cached
    p.free("a")
    p.open("b", "acme")
    p.append("b", list(range(100, 108)))  # 2 more, cached
    p.free("b")
    p.take_events()
    p.open("c", "acme")
    p.append("c", [7, 7, 7])  # needs 1 block: the free queue holds only cached blocks; evict a's tail first
    ev = p.take_events()
    assert [e.kind for e in ev] == ["removed"]
    assert ev[0].block_ids == (1,)
    assert p.metrics()["evictions_total"] == 1
    p.open("d", "acme")
    assert p.match_prefix("d", [*range(8), 1]) == 4  # a's first block survived


def test_fork_shares_and_copy_on_write_copies_the_partial_block():
    import torch

    p = pool(8, kv=KVSpec(1, 1, 2))
    p.open("a", "acme")
    slots = torch.from_numpy(p.append("a", [1, 2, 3, 4, 5, 6]))
    vals = torch.arange(12, dtype=torch.float32).view(6, 1, 2)
    p.write("a", 0, slots, vals, -vals)
    c = p.fork("a", "b")
    assert c.tenant == "acme" and c.namespace == "tenant:acme"
    assert p.block_ids("b").tolist() == p.block_ids("a").tolist()
    new = torch.from_numpy(p.append("b", [9]))  # b copies the shared, partial block first
    assert p.cow_copies == 1
    a_blocks, b_blocks = p.block_ids("a"), p.block_ids("b")
    assert a_blocks[0] == b_blocks[0] and a_blocks[1] != b_blocks[1]
    p.write("b", 0, new, torch.full((1, 1, 2), 99.0), torch.full((1, 1, 2), 99.0))
    ka, _ = p.gather(0, torch.from_numpy(a_blocks.astype(np.int64)), 6)
    kb, vb = p.gather(0, torch.from_numpy(b_blocks.astype(np.int64)), 7)
    assert torch.equal(ka, vals) and torch.equal(kb[:6], vals) and torch.equal(vb[:6], -vals)
    assert kb[6].tolist() == [[99.0, 99.0]]
    p.append("a", [7])  # a's tail is exclusive again: no second copy
    assert p.cow_copies == 1
    assert p.check_invariants() == []


def test_preempt_releases_and_keeps_the_table_for_recompute():
    p = pool(8)
    p.open("a", "acme")
    p.append("a", list(range(9)))
    assert p.preempt("a") == 3
    t = p.table("a")
    assert t.state is TableState.PREEMPTED and t.num_blocks == 0 and t.num_tokens == 0 and t.preemptions == 1
    assert p.match_prefix("a", list(range(9))) == 8  # its own cached blocks come back
    p.append("a", [8])
    assert p.table("a").state is TableState.OPEN
    assert p.metrics()["preemptions_total"] == 1
    assert p.check_invariants() == []


def test_append_is_atomic_when_the_pool_is_exhausted():
    p = pool(2)
    p.open("a", "acme")
    p.append("a", [1, 2, 3])
    with pytest.raises(PoolExhausted, match=r"needs 2 blocks for 6 tokens, 1 are free"):
        p.append("a", [4, 5, 6, 7, 8, 9])
    assert p.table("a").num_tokens == 3 and p.table("a").num_blocks == 1
    assert p.blocks_needed("a", 6) == 2 and not p.can_allocate(2)
    assert p.check_invariants() == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p.open("a", "acme"), "already has a block table"),
        (lambda p: p.append("nope", [1]), "has no open block table"),
        (lambda p: p.open("", "acme"), "non-empty string"),
        (lambda p: p.open("z", ""), "tenant must be a non-empty string"),
        (lambda p: p.match_prefix("a", [1, 2, 3]), "needs an empty table"),
    ],
)
def test_caller_mistakes_are_usage_errors(call, message):
    p = pool()
    p.open("a", "acme")
    p.append("a", [1])
    with pytest.raises(UsageError, match=message):
        call(p)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"block_size": 0}, "block_size"), ({"on_fault": "explode"}, "on_fault"), ({"num_blocks": 0}, "num_blocks"),
])
def test_bad_construction_is_a_usage_error(kwargs, message):
    args = {"num_blocks": 4, "block_size": 4, **kwargs}
    with pytest.raises(UsageError, match=message):
        PagedKVPool(args.pop("num_blocks"), args.pop("block_size"), **args)


def test_events_carry_ids_and_hashes_never_tokens():
    p = pool(8)
    p.open("a", "acme")
    p.append("a", list(range(9)))
    p.open("b", "acme")
    p.match_prefix("b", list(range(9)))
    p.reset_prefix_cache()
    kinds = [(e.seq, e.kind) for e in p.take_events()]
    assert kinds == [(1, "stored"), (2, "hit"), (3, "cleared")]
    p.open("c", "acme")
    assert p.match_prefix("c", list(range(9))) == 0
    stored = PagedKVPool(8, 4)
    stored.open("a", "acme")
    stored.append("a", [11, 22, 33, 44])
    ev = stored.take_events()[0].to_dict()
    assert ev["request_id"] == "a" and ev["namespace"] == "tenant:acme" and len(ev["block_hashes"]) == 1
    assert "token_ids" not in ev and 22 not in ev.values()


def test_event_buffer_is_bounded_and_counts_drops():
    p = PagedKVPool(64, 1, event_capacity=5)
    p.open("a", "acme")
    for i in range(20):
        p.append("a", [i])  # every token fills a block of 1: a "stored" event each
    assert len(p.events) == 5 and p.events.dropped == 15
    assert p.metrics()["events_dropped_total"] == 15
    assert [e.seq for e in p.take_events()] == [16, 17, 18, 19, 20]


def test_metrics_contract_and_exact_values():
    p = PagedKVPool(10, 4, debug=True)
    m0 = p.metrics()
    assert set(METRIC_KEYS) == set(m0)
    assert {"blocks_total", "blocks_free", "blocks_cached", "blocks_referenced", "residency_ratio",
            "fragmentation_ratio", "prefix_queries_total", "prefix_hits_total", "prefix_hit_rate",
            "evictions_total"} <= set(m0)
    assert (m0["residency_ratio"], m0["fragmentation_ratio"], m0["prefix_hit_rate"]) == (0.0, 0.0, 0.0)
    p.open("a", "acme")
    p.match_prefix("a", list(range(10)))
    p.append("a", list(range(10)))  # 2 full + 1 block with 2 tokens
    p.free("a")  # 2 cached, 1 free
    p.open("b", "acme")
    p.match_prefix("b", list(range(10)))  # 8 of 10 tokens hit
    p.append("b", [8, 9, 10])  # b: 2 shared + 1 new block with 3 tokens
    p.open("c", "globex")
    p.append("c", [1])  # 1 block, 1 token
    m = p.metrics()
    assert (m["blocks_total"], m["blocks_referenced"], m["blocks_cached"], m["blocks_free"]) == (10, 4, 0, 6)
    assert m["prefix_queries_total"] == 20 and m["prefix_hits_total"] == 8 and m["prefix_hit_rate"] == 0.4
    assert m["fragmentation_ratio"] == pytest.approx((1 + 3) / (4 * 4))
    assert m["residency_ratio"] == 0.0
    p.free("b")
    p.free("c")
    m = p.metrics()
    # cached blocks stay after their owners ended: residency is the prefix cache's share of the pool
    assert m["blocks_cached"] == 2 and m["residency_ratio"] == pytest.approx(0.2)
    assert m["residency_leaked_ratio"] == 0.0 and m["usage_ratio"] == 0.0


def test_write_and_gather_roundtrip_through_block_tables():
    import torch

    p = pool(8, kv=KVSpec(2, 2, 3))
    assert p.k[0].shape == (8, BS, 2, 3) and p.block_bytes == 2 * 2 * BS * 2 * 3 * 4
    p.open("a", "acme")
    slots = torch.from_numpy(p.append("a", list(range(7))))
    k = torch.randn(7, 2, 3)
    v = torch.randn(7, 2, 3)
    p.write("a", 1, slots, k, v)
    kg, vg = p.gather(1, torch.from_numpy(p.block_ids("a").astype(np.int64)), 7)
    assert torch.equal(kg, k) and torch.equal(vg, v)


def test_bookkeeping_pool_needs_no_torch():
    import subprocess
    import sys

    code = ("import sys; from kvguardian.runtime.paged import PagedKVPool; p = PagedKVPool(8, 4); p.open('a', 't'); "
            "p.append('a', [1, 2, 3, 4, 5]); p.check_invariants(); p.metrics(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_raw_operations_validate_and_deduplicate_block_ids():
    p = pool(8)
    p.open("a", "acme")
    ids = p.allocate_blocks("a", 2)
    p.open("b", "acme")
    p.share_blocks("b", [int(ids[1]), int(ids[0]), int(ids[1])])  # the duplicate takes one reference
    assert p.block_ids("b").tolist() == [int(ids[1]), int(ids[0])]
    assert p.blocks.ref[ids].tolist() == [2, 2]
    with pytest.raises(UsageError, match=r"block ids must be in 0..7; got 3..8"):
        p.release_blocks("b", [3, 8])
    p.release_blocks("b", ids)
    p.release_blocks("a", ids[::-1])
    p.close("a")
    p.close("b")
    assert p.check_invariants() == [] and p.blocks.num_available == 8


def test_bookkeeping_pool_refuses_kv_access():
    p = PagedKVPool(4, 4)
    p.open("a", "acme")
    with pytest.raises(UsageError, match=r"bookkeeping only \(kv=None\); fix: PagedKVPool\(..., kv=KVSpec"):
        p.gather(0, None, 1)


def test_reset_prefix_cache_requeues_the_idle_blocks_in_id_order_and_keeps_the_busy_ones():
    """After hours of churn the free queue holds blocks in a scattered LRU order; once no block is cached that
    order means nothing, and the reset queues them in id order (as on a new pool). Referenced blocks stay out
    of the queue; debug checks and the audit still hold; prefix caching works again afterwards."""
    p = pool(64)
    for i in range(12):
        p.open(f"r{i}", "acme")
        p.append(f"r{i}", [i * 100 + k for k in range(BS * (1 + i % 3) + 1)])
    for i in (7, 2, 9, 0, 11, 4, 5):
        p.free(f"r{i}")
    busy = {int(b) for i in (1, 3, 6, 8, 10) for b in p.block_ids(f"r{i}")}
    before = p.blocks.queue.live_ids().tolist()
    assert before != sorted(before)
    assert p.reset_prefix_cache() > 0
    after = p.blocks.queue.live_ids().tolist()
    assert after == sorted(before) and not busy & set(after)
    assert p.check_invariants() == []
    p.open("x", "acme")
    p.append("x", list(range(BS * 2 + 1)))
    assert p.block_ids("x").tolist() == after[:3]
    p.free("x")
    p.open("y", "acme")
    assert p.match_prefix("y", list(range(BS * 2 + 1))) == BS * 2
    assert p.check_invariants() == []
