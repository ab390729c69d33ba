"""Each fault class is caught at the operation that causes it (debug mode) and by the full audit."""

import numpy as np
import pytest
import torch

from kvguardian.runtime.paged import KVSpec, PagedKVPool, PoolFault

BS = 4


def pool(**kw):
    kw.setdefault("debug", True)
    return PagedKVPool(16, BS, KVSpec(1, 1, 2), **kw)


def write(p, rid, slots):
    s = torch.as_tensor(np.asarray(slots, dtype=np.int64))
    p.write(rid, 0, s, torch.ones(len(s), 1, 2), torch.ones(len(s), 1, 2))


def only(p, fid):
    faults = p.take_faults()
    assert [f.id for f in faults] == [fid], [f.message for f in faults]
    return faults[0]


def test_double_free_of_an_already_free_block():
    p = pool()
    p.open("x", "acme")
    b = p.allocate_blocks("x", 2)
    p.release_blocks("x", b[:1])
    assert p.take_faults() == []
    p.release_blocks("x", b[:1])
    f = only(p, "KVG201")
    ev = f.evidence
    assert (ev["request_id"], ev["block"], ev["operation"]) == ("x", int(b[0]), "release_blocks")
    assert f"released block {b[0]} which is already free (released at op #2 by 'x')" in f.message
    assert [a.id for a in p.check_invariants()] == ["KVG201", "KVG206"]


def test_freeing_a_block_another_request_still_uses():
    p = pool()
    p.open("x", "acme")
    p.open("y", "acme")
    p.allocate_blocks("x", 1)
    by = p.allocate_blocks("y", 2)
    p.release_blocks("x", by)  # a stale index: x frees y's blocks
    f = only(p, "KVG201")
    assert f.evidence["request_id"] == "x" and f.evidence["blocks"] == by.tolist()
    assert "'y' still uses it" in f.message and "(+1 more)" in f.message
    assert "KVG203" in {a.id for a in p.check_invariants()}


def test_use_after_free_write_names_the_writer_block_and_release():
    p = pool()
    p.open("x", "acme")
    p.open("y", "acme")
    by = p.allocate_blocks("y", 1)
    p.release_blocks("x", by)  # y's block freed from under it
    p.take_faults()
    p.open("z", "acme")
    bz = p.allocate_blocks("z", 1)
    assert bz[0] == by[0]  # the freed block goes to the next allocation
    p.take_faults()  # z's allocation shows the drift (y still lists the block)
    write(p, "y", [int(by[0]) * BS])
    f = only(p, "KVG202")
    assert (f.evidence["request_id"], f.evidence["block"], f.evidence["operation"]) == ("y", int(by[0]), "write")
    assert "a reference was dropped while in use (released at op #" in f.message and "by 'x'" in f.message


def test_write_into_a_block_the_writer_never_held():
    p = pool()
    p.open("x", "acme")
    p.open("y", "acme")
    by = p.allocate_blocks("y", 1)
    p.allocate_blocks("x", 1)
    write(p, "x", [int(by[0]) * BS + 1])
    f = only(p, "KVG202")
    assert f"wrote block {by[0]}, which its table does not hold; 'y' holds it" in f.message


def test_write_after_the_request_was_freed():
    p = pool()
    p.open("x", "acme")
    slots = p.append("x", [1, 2, 3])
    p.free("x")
    write(p, "x", slots)
    f = only(p, "KVG202")
    assert "has no open block table" in f.message


def test_write_into_a_shared_block_without_copy_on_write():
    p = pool()
    p.open("x", "acme")
    bx = p.allocate_blocks("x", 1)
    p.open("y", "acme")
    p.share_blocks("y", bx)  # shares x's partial block ...
    write(p, "y", [int(bx[0]) * BS + 3])  # ... and writes into it
    f = only(p, "KVG202")
    assert "shared with 'x': copy-on-write was skipped" in f.message


def test_producer_may_fill_a_block_that_a_later_request_already_hit():
    # same step: a's prompt blocks are cached at append, b hits them, then the forward pass writes a's K/V
    p = pool()
    p.open("a", "acme")
    slots = p.append("a", list(range(9)))
    p.open("b", "acme")
    assert p.match_prefix("b", list(range(9))) == 8
    write(p, "a", slots)
    write(p, "b", p.append("b", [8]))
    assert p.take_faults() == [] and p.check_invariants() == []


def test_refcount_drift_inside_the_pool_is_caught_at_that_operation(monkeypatch):
    p = pool()
    p.open("x", "acme")
    p.append("x", list(range(8)))
    p.open("y", "acme")
    real_touch = p.blocks.touch
    monkeypatch.setattr(p.blocks, "touch", lambda ids: None)  # a pool bug: a hit takes no reference
    p.match_prefix("y", list(range(9)))
    f = only(p, "KVG203")
    assert f.evidence["operation"] == "match_prefix" and f.evidence["request_id"] == "y"
    assert "ref count 1 while live tables hold 2 reference(s)" in f.message
    monkeypatch.setattr(p.blocks, "touch", real_touch)
    assert [a.id for a in p.check_invariants()] == ["KVG203"]


def test_lost_free_on_close():
    p = pool()
    p.open("x", "acme")
    b = p.append("x", [1, 2, 3, 4, 5])
    p.close("x")  # an abort path that forgot to free
    f = only(p, "KVG204")
    assert f.evidence["operation"] == "close" and f.evidence["block_count"] == 2
    assert "still referenced" in f.message and "its free was lost" in f.message
    audit = p.check_invariants()
    assert [a.id for a in audit] == ["KVG204"] and audit[0].evidence["closed_requests"] == ["x"]
    assert p.metrics()["residency_leaked_ratio"] == pytest.approx(2 / 16)
    assert b is not None


@pytest.mark.parametrize("how", ["share", "fork"])
def test_cross_tenant_share_is_caught_at_the_share(how):
    p = pool()
    p.open("x", "acme")
    bx = p.allocate_blocks("x", 2)
    if how == "share":
        p.open("y", "globex")
        p.share_blocks("y", bx)
    else:
        p.fork("x", "y", tenant="globex")
    f = only(p, "KVG205")
    assert f.evidence["request_id"] == "y" and f.evidence["operation"] == ("share_blocks" if how == "share" else "fork")
    assert "of namespace 'tenant:acme' into namespace 'tenant:globex'" in f.message
    assert [a.id for a in p.check_invariants()] == ["KVG205"]


def test_shared_namespace_fork_and_share_are_not_faults():
    p = pool()
    p.open("x", "acme", shared="sys")
    bx = p.allocate_blocks("x", 1)
    p.open("y", "globex", shared="sys")
    p.share_blocks("y", bx)
    p.fork("x", "x2")
    assert p.take_faults() == [] and p.check_invariants() == []


def test_block_lost_from_the_free_queue_is_caught(monkeypatch):
    p = pool()
    p.open("x", "acme")
    p.append("x", [1, 2, 3])
    monkeypatch.setattr(type(p.blocks.queue), "push_front", lambda self, ids: None)  # a bug: freed blocks vanish
    p.free("x")
    f = only(p, "KVG206")
    assert "outside the free queue (lost)" in f.message and f.evidence["operation"] == "free"
    monkeypatch.undo()
    audit = p.check_invariants()
    assert [a.id for a in audit] == ["KVG206"] and audit[0].evidence["counts"]["lost"] == 1


def test_raise_mode_raises_at_the_faulty_operation():
    p = pool(on_fault="raise")
    p.open("x", "acme")
    b = p.allocate_blocks("x", 1)
    p.release_blocks("x", b)
    with pytest.raises(PoolFault, match=r"KVG201 double-free: request 'x'") as exc:
        p.release_blocks("x", b)
    assert exc.value.finding.evidence["block"] == int(b[0]) and exc.value.exit_code == 1


def test_checks_only_observe_the_same_ops_give_the_same_state():
    def run(debug):
        p = PagedKVPool(16, BS, debug=debug)
        p.open("x", "acme")
        p.open("y", "acme")
        bx = p.allocate_blocks("x", 2)
        by = p.allocate_blocks("y", 2)
        p.release_blocks("x", by)
        p.release_blocks("x", by)
        p.share_blocks("y", bx)
        p.close("x")
        return p.blocks.ref.tolist(), p.blocks.queue.live_ids().tolist(), [a.id for a in p.check_invariants()]

    assert run(True) == run(False)


def test_first_fault_and_counts():
    p = pool()
    p.open("x", "acme")
    b = p.allocate_blocks("x", 1)
    p.release_blocks("x", b)
    p.release_blocks("x", b)
    p.close("x")
    assert p.first_fault().id == "KVG201" and p.first_fault("KVG204") is None
    assert p.faults_count["KVG201"] == 1 and p.metrics()["faults_total"] == 1
