"""The audit's checks on vLLM 0.32's *real* KV cache manager, without a server: run by
test_real_pool_checks.py with .venv-vllm's interpreter; prints one JSON object (scenario -> what was found).

A real ``KVCacheManager`` (its coordinator, single-type manager, BlockPool, free queue, prefix hashing) is
driven the way vLLM's scheduler drives it (get_computed_blocks, allocate_slots, free); a small stand-in
scheduler holds the live requests and makes the two calls the audit wraps (``_free_blocks`` and
``update_from_output``). Each scenario breaks one thing the way a vLLM bug would and records the findings.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections import deque
from contextlib import redirect_stderr
from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

from kvguardian.runtime.engines.vllm_plugin import hooks

BLOCK = 4
HASH = get_hash_fn_by_name("sha256")
kv_cache_utils.init_none_hash(HASH)


class MiniScheduler:
    """Holds live requests; frees and steps as vLLM 0.32's Scheduler does."""

    def __init__(self, num_blocks: int = 17) -> None:
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
        cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
        self.kv_cache_manager = KVCacheManager(cfg, max_model_len=256, scheduler_block_size=BLOCK,
                                               hash_block_size=BLOCK, enable_caching=True)
        self.requests: dict[str, Request] = {}
        self.block_size = BLOCK
        self.deferred_frees: deque[Any] = deque()
        self.hasher = kv_cache_utils.get_request_block_hasher(BLOCK, HASH)

    def add(self, rid: str, tokens: list[int], salt: str | None = None) -> Request:
        req = Request(rid, tokens, SamplingParams(max_tokens=4), None, cache_salt=salt, block_hasher=self.hasher)
        kvm = self.kv_cache_manager
        hits, n_hit, _ = kvm.get_computed_blocks(req)
        assert kvm.allocate_slots(req, len(tokens) - n_hit, n_hit, hits) is not None
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = len(tokens)
        kvm.cache_blocks(req, len(tokens))
        self.requests[rid] = req
        self.update_from_output(None, None)
        return req

    def finish(self, rid: str, status: RequestStatus = RequestStatus.FINISHED_STOPPED) -> None:
        req = self.requests[rid]
        req.status = status
        self._free_blocks(req)
        self.update_from_output(None, None)

    def _free_blocks(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> dict[str, Any]:
        return {}


def audited() -> tuple[MiniScheduler, Any]:
    sched = MiniScheduler()
    missing = hooks.missing_internals(sched)
    assert not missing, missing
    return sched, hooks.install(sched, min_interval=0.0, duty=1.0)


def found(owner: Any) -> list[dict[str, Any]]:
    owner.audit.audit(0.0)
    return [{"id": f.id, "evidence": f.evidence, "message": f.message} for f in owner.audit.board.all()]


PROMPT = list(range(10, 22))  # 12 tokens: 3 full blocks


def clean() -> dict[str, Any]:
    s, owner = audited()
    s.add("a", PROMPT)
    s.add("b", [*PROMPT, 99, 98, 97, 96])  # hits a's 3 blocks
    shared = [b.ref_cnt for b in s.kv_cache_manager.block_pool.blocks if b.ref_cnt > 1]
    s.finish("a")
    s.finish("b", RequestStatus.FINISHED_ABORTED)
    return {"findings": found(owner), "shared_ref_counts": shared, "metrics": owner.audit.metrics,
            "hits": owner.audit.prefix_hits}


def lost_free() -> dict[str, Any]:
    s, owner = audited()
    kvm = s.kv_cache_manager
    free = kvm.free
    kvm.free = lambda r: None if r.status == RequestStatus.FINISHED_ABORTED else free(r)  # the fault
    s.add("kept", PROMPT)
    blocks = [b.block_id for b in kvm.coordinator.single_type_managers[0].req_to_blocks["kept"]]
    s.finish("kept", RequestStatus.FINISHED_ABORTED)
    return {"findings": found(owner), "blocks": blocks, "usage": kvm.usage}


def double_free() -> dict[str, Any]:
    s, owner = audited()
    s.add("a", PROMPT)
    pool = s.kv_cache_manager.block_pool
    victim = s.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks["a"][-1]
    pool.free_blocks(reversed([victim, victim]))  # freed twice in one call, through vLLM's own free_blocks
    return {"findings": found(owner), "victim": victim.block_id, "ref_cnt_after": victim.ref_cnt}


def drift() -> dict[str, Any]:
    s, owner = audited()
    s.add("a", PROMPT)
    block = s.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks["a"][0]
    block.ref_cnt += 1  # a touch nobody undoes
    return {"findings": found(owner), "block": block.block_id}


def queue_count() -> dict[str, Any]:
    s, owner = audited()
    s.add("a", PROMPT)
    s.kv_cache_manager.block_pool.free_block_queue.num_free_blocks -= 1
    return {"findings": found(owner)}


def salt_ignored() -> dict[str, Any]:
    keys = kv_cache_utils.generate_block_hash_extra_keys

    def without_salt(request: Any, start: int, end: int, mm: int) -> Any:
        extra, nxt = keys(request, start, end, mm)
        extra = tuple(k for k in (extra or ()) if k[0] != "cache_salt") or None
        return extra, nxt

    kv_cache_utils.generate_block_hash_extra_keys = without_salt
    try:
        s, owner = audited()
        s.add("alice", PROMPT, salt="tenant-a")
        s.finish("alice")
        s.add("bob", PROMPT, salt="tenant-b")
        result = {"findings": found(owner), "hits": owner.audit.prefix_hits}
    finally:
        kv_cache_utils.generate_block_hash_extra_keys = keys
    s2, owner2 = audited()  # and with the salt hashed, as vLLM does: no sharing
    s2.add("alice", PROMPT, salt="tenant-a")
    s2.finish("alice")
    s2.add("bob", PROMPT, salt="tenant-b")
    result["with_salt"] = {"findings": found(owner2), "hits": owner2.audit.prefix_hits}
    return result


def fail_open() -> dict[str, Any]:
    s, owner = audited()

    def broken(*_a: Any) -> None:
        raise RuntimeError("a bug in the audit")

    owner.audit.after_free_request = broken
    s.add("a", PROMPT)
    err = io.StringIO()
    with redirect_stderr(err):
        s.finish("a")
    pool = s.kv_cache_manager.block_pool
    return {"errors": owner.wrapper_errors, "referenced_after": sum(b.ref_cnt > 0 for b in pool.blocks[1:]),
            "free_after": pool.get_num_free_blocks(), "findings": [f.id for f in owner.audit.board.all()]}


def unknown_version() -> dict[str, Any]:
    import vllm

    from kvguardian.runtime.engines import vllm_plugin

    os.environ["KVG_VLLM_AUDIT"] = "1"
    os.environ.pop("KVG_VLLM_AUDIT_REFUSED", None)
    real, vllm.__version__ = vllm.__version__, "0.99.0"
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            vllm_plugin.register()
            vllm_plugin.register()
    finally:
        vllm.__version__ = real
    return {"stderr": err.getvalue(), "patched": vllm_plugin._state["patched"]}


def main() -> None:
    out = {}
    for fn in (clean, lost_free, double_free, drift, queue_count, salt_ignored, fail_open, unknown_version):
        out[fn.__name__] = fn()
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main()
