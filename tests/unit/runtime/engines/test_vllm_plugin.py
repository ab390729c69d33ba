"""The vLLM audit's checks, hooks and reporting on stand-ins shaped like vLLM 0.32's v1 core (no vLLM needed).

The same checks run against vLLM's real classes in tests/integration/vllm_real (a real KVCacheManager, and a real
server with injected faults); here each check, the fail-open wrappers and the version refusal are pinned
down quickly.
"""

from __future__ import annotations

import json
import sys
import types
import urllib.request
from collections import defaultdict

import pytest

from kvguardian.runtime.engines.vllm_plugin import hooks
from kvguardian.runtime.engines.vllm_plugin.audit import namespace_of
from kvguardian.runtime.engines.vllm_plugin.sink import AuditSink


class Block:
    __hash__ = None  # type: ignore[assignment]  # vLLM's KVCacheBlock is an eq dataclass: unhashable

    def __init__(self, block_id, pool=None):
        self.block_id, self.ref_cnt, self._block_hash, self.is_null, self.pool = block_id, 0, None, False, pool
        self.prev_free_block = self.next_free_block = None

    @property
    def block_hash(self):  # as vLLM's: a property over _block_hash
        return self._block_hash

    @block_hash.setter
    def block_hash(self, value):
        self._block_hash = value

    def __eq__(self, other):
        return isinstance(other, Block) and other.block_id == self.block_id


class FreeQueue:
    """A doubly linked free list with fake head and tail, as FreeKVCacheBlockQueue."""

    def __init__(self, blocks):
        self.fake_free_list_head, self.fake_free_list_tail = Block(-1), Block(-1)
        self.num_free_blocks = 0
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = self.fake_free_list_head
        for b in blocks:
            self.append(b)

    def append(self, b):
        last = self.fake_free_list_tail.prev_free_block
        last.next_free_block, b.prev_free_block = b, last
        b.next_free_block, self.fake_free_list_tail.prev_free_block = self.fake_free_list_tail, b
        self.num_free_blocks += 1

    def remove(self, b):
        b.prev_free_block.next_free_block, b.next_free_block.prev_free_block = b.next_free_block, b.prev_free_block
        b.prev_free_block = b.next_free_block = None
        self.num_free_blocks -= 1

    def popleft(self):
        b = self.fake_free_list_head.next_free_block
        self.remove(b)
        return b


class Pool:
    enable_caching = True

    def __init__(self, n):
        self.blocks = [Block(i, self) for i in range(n)]
        self.free_block_queue = FreeQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_new_blocks(self, n):
        if n > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {n} free blocks from the pool")
        out = [self.free_block_queue.popleft() for _ in range(n)]
        for b in out:
            self._maybe_evict_cached_block(b)
            b.ref_cnt += 1
        return out

    def touch(self, blocks):
        for b in blocks:
            if b.ref_cnt == 0:
                self.free_block_queue.remove(b)
            b.ref_cnt += 1

    def free_blocks(self, ordered_blocks):
        for b in ordered_blocks:
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free_block_queue.append(b)

    def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id,
                          block_mask=None):
        for i, b in enumerate(blocks[num_cached_blocks:num_full_blocks], start=num_cached_blocks):
            b.block_hash = (request.prefix_key, i)

    def _maybe_evict_cached_block(self, b):
        had = b.block_hash is not None
        b.block_hash = None
        return had

    def reset_prefix_cache(self):
        for b in self.blocks:
            b.block_hash = None
        return True


class Req:
    def __init__(self, rid, n_tokens, salt=None, prefix_key="p"):
        self.request_id, self.num_tokens, self.num_computed_tokens, self.cache_salt = rid, n_tokens, n_tokens, salt
        self.status = types.SimpleNamespace(name="RUNNING")
        self.prefix_key = prefix_key


class Manager:
    def __init__(self):
        self.req_to_blocks = defaultdict(list)


class KVM:
    def __init__(self, pool):
        self.block_pool = pool
        self.coordinator = types.SimpleNamespace(single_type_managers=(Manager(),))

    def get_computed_blocks(self, request):
        cached = [b for b in self.block_pool.blocks
                  if b.block_hash is not None and b.block_hash[0] == request.prefix_key]
        return types.SimpleNamespace(blocks=(cached,)), len(cached) * 4, 0


class Scheduler:
    """The scheduler's calls the hooks wrap, doing what vLLM's do to the structures."""

    block_size = 4

    def __init__(self, n_blocks=9):
        self.requests = {}
        self.kv_cache_manager = KVM(Pool(n_blocks))
        self.deferred_frees = []
        self.leak_on_abort = False

    @property
    def table(self):
        return self.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks

    def add(self, req, n_new):
        kvm = self.kv_cache_manager
        hits, _, _ = kvm.get_computed_blocks(req)
        kvm.block_pool.touch(hits.blocks[0])
        self.table[req.request_id] = list(hits.blocks[0]) + kvm.block_pool.get_new_blocks(n_new)
        kvm.block_pool.cache_full_blocks(request=req, blocks=self.table[req.request_id],
                                         num_cached_blocks=len(hits.blocks[0]),
                                         num_full_blocks=len(self.table[req.request_id]), block_size=4,
                                         kv_cache_group_id=0)
        self.requests[req.request_id] = req

    def finish(self, rid, status="FINISHED_STOPPED"):
        req = self.requests[rid]
        req.status = types.SimpleNamespace(name=status)
        self._free_blocks(req)
        self.update_from_output(None, None)

    def _free_blocks(self, request):
        if not (self.leak_on_abort and request.status.name == "FINISHED_ABORTED"):
            self.kv_cache_manager.block_pool.free_blocks(reversed(self.table.pop(request.request_id, [])))
        del self.requests[request.request_id]

    def update_from_output(self, scheduler_output, model_runner_output):
        return {}


@pytest.fixture
def sched():
    s = Scheduler()
    assert hooks.missing_internals(s) == []
    owner = hooks.install(s, min_interval=0.0, duty=1.0)
    return s, owner


def ids(findings):
    return sorted(f.id for f in findings)


def test_a_clean_pool_has_no_finding_and_adds_up(sched):
    s, owner = sched
    s.add(Req("a", 8), 2)
    s.add(Req("b", 8), 0)  # a prefix hit on a's two blocks
    s.update_from_output(None, None)
    m = owner.audit.metrics
    assert (m["blocks_referenced"], m["blocks_free"], m["blocks_total"]) == (2, 6, 8)
    s.finish("a")
    s.finish("b")
    assert owner.audit.board.all() == []
    assert owner.audit.metrics["blocks_cached"] == 2 and owner.audit.metrics["blocks_referenced"] == 0
    assert owner.audit.prefix_hits == 8 and owner.audit.audits >= 2


def test_an_aborted_request_that_keeps_its_blocks_is_named_with_its_blocks(sched):
    s, owner = sched
    s.leak_on_abort = True
    s.add(Req("gone", 8, prefix_key="x"), 2)
    blocks = [b.block_id for b in s.table["gone"]]
    s.finish("gone", "FINISHED_ABORTED")
    (f,) = owner.audit.board.active()
    assert f.id == "KVG204" and f.evidence["request_id"] == "gone" and f.evidence["status"] == "FINISHED_ABORTED"
    assert f.evidence["blocks"] == blocks and "when the scheduler freed it" in f.message
    assert owner.audit.metrics["blocks_lost"] == 2 and owner.audit.lost_requests == {"gone"}
    s.kv_cache_manager.block_pool.free_blocks(s.table.pop("gone"))  # someone frees them after all
    s.update_from_output(None, None)
    assert owner.audit.board.active() == [] and owner.audit.lost_requests == set()


def test_a_block_freed_twice_is_a_double_free_and_the_counts_then_drift(sched):
    s, owner = sched
    s.add(Req("a", 8), 2)
    pool = s.kv_cache_manager.block_pool
    victim = s.table["a"][0]
    pool.free_blocks(iter([victim, victim]))  # an iterator, as vLLM passes reversed(...)
    assert victim.ref_cnt == -1  # vLLM's own free ran, unchanged
    s.update_from_output(None, None)
    assert ids(owner.audit.board.active()) == ["KVG201", "KVG201", "KVG203", "KVG206"]
    double = next(f for f in owner.audit.board.active() if f.id == "KVG201" and "in one call" in f.message)
    assert double.evidence["blocks"] == [victim.block_id]


def test_a_referenced_block_left_in_the_free_queue_breaks_conservation(sched):
    s, owner = sched
    s.add(Req("a", 8), 1)
    pool = s.kv_cache_manager.block_pool
    pool.free_block_queue.num_free_blocks += 1  # the queue's count and its links disagree
    s.update_from_output(None, None)
    (f,) = owner.audit.board.active()
    assert f.id == "KVG206" and f.evidence["queue_count"] == f.evidence["queue_linked"] + 1


def test_a_prefix_hit_across_cache_salts_is_cross_tenant(sched):
    s, owner = sched
    s.add(Req("alice", 8, salt="s3cret-A"), 2)
    s.finish("alice")
    s.add(Req("bob", 8, salt="s3cret-B"), 0)  # same prefix key: the stand-in hashes without the salt
    (f,) = owner.audit.board.active()
    assert f.id == "KVG205" and f.evidence["request_id"] == "bob"
    assert f.evidence["namespace"] == namespace_of(Req("x", 1, salt="s3cret-B")) != "s3cret-B"
    assert "s3cret" not in json.dumps(f.to_dict())  # salts appear only as digests
    s.finish("bob")


def test_same_salt_reuse_and_reset_are_healthy(sched):
    s, owner = sched
    s.add(Req("a1", 8, salt="t"), 2)
    s.finish("a1")
    s.add(Req("a2", 8, salt="t"), 0)
    s.finish("a2")
    assert s.kv_cache_manager.block_pool.reset_prefix_cache()
    s.add(Req("b", 8, salt="u"), 2)  # nothing cached any more: fresh blocks
    s.finish("b")
    assert owner.audit.board.all() == []


def test_a_failing_check_never_reaches_vllm_and_degrades_once(sched, monkeypatch):
    s, owner = sched

    def boom(*_a, **_k):
        raise RuntimeError("audit bug")

    monkeypatch.setattr(owner.audit, "after_free_request", boom)
    s.add(Req("a", 8), 2)
    for _ in range(hooks._MAX_ERRORS + 5):
        s.finish("a")
        s.add(Req("a", 8), 0)
    assert owner.wrapper_errors == hooks._MAX_ERRORS and not owner.enabled
    assert [f.id for f in owner.audit.board.all()] == ["KVG100"]
    s.finish("a")  # vLLM's calls go on as without the audit
    assert s.requests == {}


def test_missing_internals_are_named():
    s = Scheduler()
    del s.kv_cache_manager.block_pool.free_block_queue.fake_free_list_tail
    s.kv_cache_manager.coordinator.single_type_managers = (types.SimpleNamespace(),)
    missing = hooks.missing_internals(s)
    assert "kv_cache_manager.block_pool.free_block_queue.fake_free_list_tail" in missing
    assert "SimpleNamespace.req_to_blocks" in missing


def test_an_unknown_vllm_version_is_refused_with_one_line(monkeypatch, capsys):
    from kvguardian.runtime.engines import vllm_plugin

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.99.1"))
    monkeypatch.setenv("KVG_VLLM_AUDIT", "1")
    monkeypatch.delenv("KVG_VLLM_AUDIT_REFUSED", raising=False)
    monkeypatch.setitem(vllm_plugin._state, "patched", False)
    vllm_plugin.register()
    vllm_plugin.register()  # again (another vLLM process): silent
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vLLM 0.99.1 is not a version" in err[0] and "unaudited" in err[0]
    assert not vllm_plugin._state["patched"]


def test_disabled_by_default(monkeypatch, capsys):
    from kvguardian.runtime.engines import vllm_plugin

    monkeypatch.delenv("KVG_VLLM_AUDIT", raising=False)
    monkeypatch.setitem(sys.modules, "vllm", None)  # importing vllm would fail: register must not try
    vllm_plugin.register()
    assert capsys.readouterr().err == ""


def test_the_sink_writes_a_report_the_exporter_reads_and_serves_metrics(sched, tmp_path):
    from kvguardian.apps.cli.exporter import ReportFiles

    s, owner = sched
    s.leak_on_abort = True
    s.add(Req("gone", 8), 2)
    s.finish("gone", "FINISHED_ABORTED")
    path = tmp_path / "audit-{pid}.json"
    sink = AuditSink(owner, report_path=str(path), port=0)
    try:
        sink.flush()
        body = urllib.request.urlopen(sink.exporter.url, timeout=5).read().decode()
    finally:
        sink.close()
    written = next(tmp_path.glob("audit-*.json"))
    findings, _ = ReportFiles([str(written)]).read()
    assert [f.id for f in findings] == ["KVG204"]
    assert 'kvguardian_findings{id="KVG204",name="lost-free",severity="error"} 1.0' in body
    assert 'kvguardian_pool_blocks{pool="vllm",state="referenced"} 2.0' in body
    assert "kvguardian_vllm_lost_free_requests 1.0" in body and "kvguardian_vllm_audit_enabled 1.0" in body


def test_evictions_are_the_cached_blocks_an_allocation_takes(sched):
    s, owner = sched
    s.add(Req("a", 8, prefix_key="a"), 2)
    s.finish("a")  # its 2 blocks stay cached, at the back of the free queue
    s.add(Req("big", 24, prefix_key="b"), 7)  # of 8 usable blocks: the 6 never used, then 1 cached one
    assert owner.audit.evictions == 1
    with pytest.raises(ValueError):
        s.add(Req("huge", 4, prefix_key="c"), 5)  # more than is free: vLLM refuses, nothing is taken
    assert owner.audit.evictions == 1
