"""KV remanence: scrubbing blocks that pass to another tenant, and the KVG211 residue check."""

from __future__ import annotations

import pytest
import torch

from kvguardian.core.errors import UsageError
from kvguardian.runtime.paged import KVSpec, PagedKVPool

SPEC = KVSpec(num_layers=2, kv_heads=1, head_dim=4)


def fill(pool, rid, tenant, n, value):
    pool.open(rid, tenant)
    slots = torch.from_numpy(pool.append(rid, list(range(100 + len(rid), 100 + len(rid) + n))))
    kv = torch.full((n, 1, 4), float(value))
    for layer in range(2):
        pool.write(rid, layer, slots, kv, kv)
    return pool.block_ids(rid)


def block_sum(pool, block):
    return sum(float(pool.k[layer][block].abs().sum() + pool.v[layer][block].abs().sum()) for layer in range(2))


@pytest.mark.parametrize(("policy", "same_tenant_zeroed", "other_tenant_zeroed"), [
    ("never", False, False), ("on-tenant-change", False, True), ("always", True, True)])
def test_scrub_policies(policy, same_tenant_zeroed, other_tenant_zeroed):
    for tenant, zeroed in (("acme", same_tenant_zeroed), ("globex", other_tenant_zeroed)):
        pool = PagedKVPool(1, 4, SPEC, prefix_caching=False, scrub=policy)
        [b] = fill(pool, "r-1", "acme", 2, 7.0)
        pool.free("r-1")
        pool.open("r-2", tenant)
        pool.append("r-2", [1])  # takes the one block back
        assert pool.block_ids("r-2").tolist() == [b]
        assert (block_sum(pool, b) == 0) == zeroed, (policy, tenant)
        if policy != "never":
            assert pool.remanence.scrubbed_blocks == int(zeroed)
            assert pool.remanence.tenant_changes == int(tenant != "acme")


def test_bad_scrub_policy():
    with pytest.raises(UsageError, match="scrub must be one of"):
        PagedKVPool(4, 4, SPEC, scrub="sometimes")


def test_residue_read_names_request_block_slot_and_previous_tenant():
    pool = PagedKVPool(1, 4, SPEC, prefix_caching=False, debug=True)
    fill(pool, "victim", "acme", 4, 3.0)  # fills the whole block
    pool.free("victim")
    [b] = fill(pool, "attacker", "globex", 1, 1.0)  # owns the block, wrote slot 0 only
    k, _ = pool.gather(0, torch.tensor([b]), 1, request_id="attacker")  # a correct read: no finding
    assert pool.faults == []
    k, _ = pool.gather(0, torch.tensor([b]), 4, request_id="attacker")  # reads past its length
    assert float(k[1:].abs().sum()) > 0  # the victim's K is really there (no scrub)
    [f] = pool.faults
    assert f.id == "KVG211"
    ev = f.evidence
    assert ev["request_id"] == "attacker" and ev["block"] == b and ev["slot"] == b * 4 + 1
    assert ev["slot_in_block"] == 1 and ev["slots"] == [b * 4 + 1, b * 4 + 2, b * 4 + 3]
    assert ev["layer"] == 0 and ev["previous_tenant"] == "acme" and ev["scrubbed"] is False
    assert "'attacker'" in f.message and "tenant 'acme'" in f.message
    pool.gather(1, torch.tensor([b]), 4, request_id="attacker")  # the same bad read, next layer: once
    assert len(pool.faults) == 1


def test_scrubbed_residue_reads_zeros_and_is_still_a_finding():
    pool = PagedKVPool(1, 4, SPEC, prefix_caching=False, debug=True, scrub="on-tenant-change")
    fill(pool, "victim", "acme", 4, 3.0)
    pool.free("victim")
    [b] = fill(pool, "attacker", "globex", 1, 1.0)
    k, v = pool.gather(0, torch.tensor([b]), 4, request_id="attacker")
    assert float(k[1:].abs().sum() + v[1:].abs().sum()) == 0
    assert [f.id for f in pool.faults] == ["KVG211"] and pool.faults[0].evidence["scrubbed"] is True


def test_prefix_hits_and_copy_on_write_are_not_residue():
    pool = PagedKVPool(8, 4, SPEC, debug=True, on_fault="raise")
    fill(pool, "a", "acme", 6, 2.0)  # one full block (cached) + a partial one
    pool.free("a")
    pool.open("b", "acme")
    prompt = list(range(101, 107))  # the same tokens "a" had
    hit = pool.match_prefix("b", prompt)
    assert hit == 4
    slots = torch.from_numpy(pool.append("b", prompt[hit:]))
    kv = torch.ones(len(slots), 1, 4)
    for layer in range(2):
        pool.write("b", layer, slots, kv, kv)
        pool.gather(layer, torch.from_numpy(pool.block_ids("b").astype("int64")), 6, request_id="b")
    pool.fork("b", "c")
    slots = torch.from_numpy(pool.append("c", [9]))  # copy-on-write of the shared partial block
    for layer in range(2):
        pool.write("c", layer, slots, torch.ones(1, 1, 4), torch.ones(1, 1, 4))
        pool.gather(layer, torch.from_numpy(pool.block_ids("c").astype("int64")), 7, request_id="c")
    assert pool.faults == [] and pool.cow_copies == 1
