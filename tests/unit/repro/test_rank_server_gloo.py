"""The broadcast variant's ended-sequence KV is exact without a GC pass, however late gloo lets go of a tensor.

torch.distributed's gloo backend keeps a reference to a broadcast tensor after ``dist.broadcast`` returns: the
Work (its ``inputs``) outlives ``wait()``, and ``ProcessGroupGloo::runLoop`` drops its own reference to the Work
in its worker thread (``pt_gloo_runloop``) some time later. A tracked KV storage handed to gloo could therefore
die after its sequence ended, which `rank_server._ended_bytes` counted as held (8,192 bytes, flaky under load).
"""

from __future__ import annotations

import gc
import time
import weakref
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("transformers")


@pytest.fixture
def no_gc():
    """No automatic collection: what is freed below is freed by reference counting alone."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")
def test_gloo_keeps_the_broadcast_tensor_after_wait_and_no_gc_pass_frees_it(no_gc):
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    t = torch.ones(2048)
    storage = weakref.ref(t.untyped_storage())
    work = pg.broadcast([t], opts)
    work.wait()  # what dist.broadcast(t) waits for before returning
    del t
    gc.collect()
    assert storage() is not None  # held by torch's Work (not a cycle: a GC pass does not free it)
    del work  # the Python side lets go; gloo's worker thread drops its own reference when it gets to it
    deadline = time.monotonic() + 10
    while storage() is not None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert storage() is None


@pytest.fixture(scope="module")
def vlm():
    from kvguardian.apps.repro.vlm import VLM_TINY, build_vlm

    return build_vlm(VLM_TINY, seed=0)


@pytest.mark.parametrize("rank", [0, 1])
def test_broadcast_variant_ended_kv_is_exact_unsettled_whatever_gloo_holds(vlm, rank, monkeypatch, no_gc):
    from kvguardian.apps.repro import rank_server
    from kvguardian.apps.repro.vlm import VLM_TINY
    from kvguardian.runtime.guard import Guard

    kept = []  # every tensor handed to the collective, kept past the sequence: gloo's worker at its slowest

    def broadcast(t, src=0, **_):
        if rank != 0:
            t.zero_()  # what the receiving rank gets
        kept.append(t)

    monkeypatch.setattr(dist, "broadcast", broadcast)
    guard = Guard()
    guard.attach(vlm)
    try:
        server = rank_server.RankServer(vlm, guard, rank, "broadcast", VLM_TINY)
        server.run_sequence("seq-0", image_seed=1000, new_tokens=2)
        assert len(kept) == 2 * VLM_TINY.layers
        assert server.comm_bytes == VLM_TINY.visual_kv_bytes()
        assert rank_server._ended_bytes(guard, settle=False) == (0, 0)
    finally:
        guard.detach()
