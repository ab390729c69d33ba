"""Cache shapes beyond one decoder's DynamicCache, through the real classes of the installed transformers (the
oldest supported 5.x in .venv-tf50, the newest locked in .venv): speculative decoding's assistant caches,
encoder-decoder caches (T5, BART), hybrid sliding/full layers, layers moved to another device or dtype, and
offloaded caches (CUDA only in every 5.x: ``OffloadedCache`` streams through ``torch.cuda``). Tiny models from a
config, random weights. Each shape's leaking and clean programs are in tests/corpus."""

import dataclasses
import gc

import pytest
import torch

from kvguardian.apps.repro.models import DRAFT, build_bart, build_hybrid, build_llama
from kvguardian.runtime.guard import Guard
from kvguardian.runtime.hf import instrument
from kvguardian.runtime.hf.compat import output_cache


def ids_of(n, seed=0):
    return torch.randint(2, 60, (1, n), generator=torch.Generator().manual_seed(seed))


def gen(model, ids, **kw):
    return model.generate(ids, do_sample=False, return_dict_in_generate=True, **kw)


def cache_inits(guard, request_id):
    return sorted((e.detail, e.nbytes) for e in guard.events()
                  if e.scope == "cache" and e.kind == "init" and e.request_id == request_id)


@pytest.fixture(scope="module")
def pair():
    """A 4-layer model and its 1-layer assistant (one vocabulary)."""
    return build_llama(dataclasses.replace(DRAFT, layers=4)), build_llama(dataclasses.replace(DRAFT, layers=1))


def test_assistant_caches_are_the_requests_kv_for_an_attached_model(pair):
    """``generate(assistant_model=...)`` of an attached model: the assistant (not attached) runs its own forwards
    and caches; both caches are observed, as KV of the request, and the assistant is not attached after."""
    main, draft = pair
    g = Guard().attach(main)
    kept = []
    hook = draft.register_forward_hook(lambda module, args, output: kept.append(output))
    try:
        with g.request("spec", tenant="t"):
            out = gen(main, ids_of(7), assistant_model=draft, max_new_tokens=5)
        inits = cache_inits(g, "spec")
        assert [d for d, _ in inits] == ["1 layers", "4 layers"], inits
        assert instrument.attached(draft) is None and instrument.attached(main) is not None
        # the draft's outputs kept by the hook hold its cache: that request's KV, orphaned, held by the list
        report = g.check()
        orphaned = report.by_id("KVG102")
        draft_cache = output_cache(kept[-1])
        draft_bytes = sum(t.untyped_storage().nbytes() for layer in draft_cache.layers
                          for t in (layer.keys, layer.values))
        main_bytes = sum(t.untyped_storage().nbytes() for layer in output_cache(out).layers
                         for t in (layer.keys, layer.values))
        assert len(orphaned) == 1 and orphaned[0].evidence["bytes"] == draft_bytes + main_bytes
        assert orphaned[0].evidence["layers"] == [0, 1, 2, 3]
    finally:
        hook.remove()
        g.detach()


def test_assistant_of_a_process_audit_is_the_requests_kv(pair):
    main, draft = pair
    g = Guard().attach_process()
    try:
        out = gen(main, ids_of(7), assistant_model=draft, max_new_tokens=5)
        [rid] = {e.request_id for e in g.events() if e.scope == "cache" and e.kind == "init"}
        assert [d for d, _ in cache_inits(g, rid)] == ["1 layers", "4 layers"]
        assert output_cache(out) is not None
    finally:
        g.detach_process()


def test_bart_self_and_cross_attention_caches():
    bart = build_bart()
    g = Guard().attach(bart)
    try:
        with g.request("bart"):
            out = gen(bart, ids_of(9), max_new_tokens=3)
        recs = [r for r in g.snapshot().records if r.request_id == "bart"]
        assert {r.role for r in recs} == {"self", "cross"}
        assert all(r.shape[-2] == 9 for r in recs if r.role == "cross")  # the encoder's 9 tokens
        report = g.check()
        [finding] = report.by_id("KVG102")  # the local `out` holds both: one request, its bytes
        assert finding.evidence["bytes"] == sum(r.storage_bytes for r in recs)
        assert finding.evidence["roles"] == ["cross", "self"]
        del out
    finally:
        g.detach()


def test_hybrid_sliding_and_full_layers_in_one_cache():
    model = build_hybrid(window=4)
    g = Guard().attach(model)
    try:
        with g.request("h"):
            out = gen(model, ids_of(7), max_new_tokens=4)
        recs = [r for r in g.snapshot().records if r.request_id == "h"]
        assert {(r.layer, r.source) for r in recs} == {(0, "DynamicSlidingWindowLayer"), (1, "DynamicLayer")}
        full = [r for r in recs if r.layer == 1]
        assert all(r.shape[-2] == 10 for r in full)  # 7 prompt tokens + 3 fed back
        assert output_cache(out) is not None
    finally:
        g.detach()


def layer_bytes(cache):
    return sum(t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values))


def test_layers_moved_to_another_dtype_or_device_stay_the_requests_kv(tiny_model):
    """After the request, a program moves a kept cache's layers (``layer.keys = layer.keys.to(...)``: CPU to CPU
    at half precision, and one layer to the meta device, which holds no memory). The moved storages are that
    request's KV, orphaned, at their new size; the meta layer holds none. CPU only here: a move to a GPU is the
    same ``.to()`` of the layer's tensors."""
    g = Guard().attach(tiny_model)
    try:
        with g.request("moved"):
            cache = output_cache(gen(tiny_model, ids_of(8), max_new_tokens=4))
        before = layer_bytes(cache)
        half, meta = cache.layers
        half.keys, half.values = half.keys.to(torch.float16), half.values.to(torch.float16)
        meta.keys, meta.values = meta.keys.to("meta"), meta.values.to("meta")
        gc.collect()
        recs = [r for r in g.snapshot().records if r.request_id == "moved"]
        assert {(r.layer, r.dtype) for r in recs} == {(0, "torch.float16")}
        assert sum(r.storage_bytes for r in recs) * 4 == before  # one layer of two, at half the bytes
        [finding] = g.check().by_id("KVG102")
        assert finding.evidence["bytes"] * 4 == before and finding.evidence["layers"] == [0]
    finally:
        g.detach()


def test_layers_moved_right_after_the_request_are_seen_at_the_next_request_end(tiny_model):
    """Retention is sampled at request ends: a cache parked (moved) after its request is in the ledger by the
    next request's end, not only at a snapshot."""
    g = Guard().attach(tiny_model)
    try:
        with g.request("a"):
            cache = output_cache(gen(tiny_model, ids_of(8), max_new_tokens=2))
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.to(torch.float16), layer.values.to(torch.float16)
        gc.collect()
        with g.request("b"):
            gen(tiny_model, ids_of(6, 1), max_new_tokens=2)
        live = [r for r in g.ledger.records() if r.request_id == "a"]  # no snapshot (no sync) taken
        assert len(live) == 4 and {r.dtype for r in live} == {"torch.float16"}
    finally:
        g.detach()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offloaded caches need CUDA in every transformers 5.x "
                                                          "(torch.cuda streams); CPU-only here")
def test_offloaded_cache_on_cuda(tiny_model):  # pragma: no cover - runs only where CUDA is
    model = tiny_model.to("cuda")
    g = Guard().attach(model)
    try:
        with g.request("off"):
            out = gen(model, ids_of(8).cuda(), max_new_tokens=4, cache_implementation="offloaded")
        recs = [r for r in g.snapshot().records if r.request_id == "off"]
        assert recs and {r.device for r in recs} == {"cpu"}  # offloaded after each update
        [finding] = g.check().by_id("KVG102")
        assert finding.evidence["bytes"] == layer_bytes(output_cache(out))
    finally:
        g.detach()
        tiny_model.to("cpu")


def test_an_assistant_two_overlapping_calls_share_stays_observed_until_the_last_ends(pair):
    """Two ``generate(assistant_model=draft)`` calls that overlap (threads of one server) lend the same assistant:
    the first call to end must not take it from the second, whose assistant caches were then not observed."""
    import threading

    main, draft = pair
    g = Guard().attach(main)
    att = instrument.attached(main)
    try:
        first, second = att.lend(draft), att.lend(draft)
        assert first is not None and second is not None
        first()
        assert instrument.attached(draft) is not None, "the second call's assistant is still observed"
        second()
        assert instrument.attached(draft) is None
        # the same through real generate() calls in two threads, the first ending while the second runs
        inside, release = threading.Event(), threading.Event()

        def hold(*_):  # the slow call waits inside its assistant's first forward
            inside.set()
            release.wait(30)

        hook = draft.register_forward_hook(hold)
        seen = []

        def slow():
            with g.request("slow"):
                gen(main, ids_of(7, seed=1), assistant_model=draft, max_new_tokens=3)

        th = threading.Thread(target=slow)
        th.start()
        assert inside.wait(60)
        hook.remove()
        with g.request("quick"):
            gen(main, ids_of(5, seed=2), assistant_model=draft, max_new_tokens=3)
        seen.append(instrument.attached(draft) is not None)
        release.set()
        th.join(60)
        assert seen == [True], "the slow call's assistant stayed observed after the quick call ended"
        assert instrument.attached(draft) is None
        assert [d for d, _ in cache_inits(g, "slow")] == ["1 layers", "4 layers"]
    finally:
        g.detach()
