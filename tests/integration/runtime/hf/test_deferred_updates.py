"""An attached model's cache updates are observed when its forward returns (see hf.instrument.Attachment), and
so are those of any top-level model forward under the process audit (`instrument.observe_forward`): what that
must not change - nothing extra kept alive meanwhile, order against crop/reset, a forward that raises,
first-token latency - checked on the tiny model (both transformers virtualenvs)."""

import pytest
import torch
from transformers import DynamicCache, QuantizedCache

from kvguardian.runtime.guard import Guard
from kvguardian.runtime.hf import instrument
from kvguardian.runtime.hf.compat import cache_kwarg, transformers_version

KW = cache_kwarg()


def ids_of(n, seed=0):
    return torch.randint(1, 60, (1, n), generator=torch.Generator().manual_seed(seed))


def in_forward(model, fn):
    """Run ``fn(pending)`` inside the model's forward, after every decoder layer (a hook on the final norm)."""
    seen = []

    def hook(module, args, output):
        seen.append(fn(instrument.PENDING.get()))

    return model.model.norm.register_forward_hook(hook), seen


@pytest.mark.parametrize("make", [
    lambda m: DynamicCache(config=m.config),
    pytest.param(lambda m: QuantizedCache(backend="fp8", config=m.config), marks=pytest.mark.skipif(
        transformers_version() < (5, 21), reason="QuantizedCache(backend='fp8') appears in transformers 5.21")),
], ids=["dynamic", "fp8"])
def test_pending_updates_keep_no_tensors_alive(tiny_model, make):
    g = Guard().attach(tiny_model)

    def inspect(pending):
        return [(type(p[2]), p[5], [a for a in p[3] if isinstance(a, torch.Tensor) and a.numel() > 64])
                for p in pending]

    handle, seen = in_forward(tiny_model, inspect)
    try:
        with torch.inference_mode():
            tiny_model(ids_of(12), use_cache=True, **{KW: make(tiny_model)})
    finally:
        handle.remove()
        g.detach()
    layers = tiny_model.config.num_hidden_layers
    assert len(seen) == 1 and len(seen[0]) == layers  # one pending update per layer, none observed yet
    for i, (key_type, returned, big_args) in enumerate(seen[0]):
        # the new keys are summarised (shape, dtype, device) on the cache's first update in the forward, the one
        # where a request enters it, and not read at all on the others; never held. A quantized cache's
        # dequantized copies (what update() returns) are not held either: the model's peak memory is unchanged
        assert key_type is (instrument.KeyInfo if i == 0 else type(None))
        assert returned is None
        assert big_args == []


def guard_on(model, path):
    g = Guard()
    return g.attach(model) if path == "attached" else g.attach_process()


@pytest.mark.parametrize("path", ["attached", "process"])
def test_updates_are_observed_when_the_forward_returns(tiny_model, path):
    g = guard_on(tiny_model, path)
    handle, seen = in_forward(tiny_model, lambda pending: len(g.snapshot().records))
    try:
        with g.request("r1"), torch.inference_mode():
            out = tiny_model(ids_of(6), use_cache=True, **{KW: DynamicCache(config=tiny_model.config)})
            after = [r for r in g.snapshot().records if r.request_id == "r1"]
        del out
    finally:
        handle.remove()
        g.detach()
    assert seen == [0]
    assert {(r.layer, r.kind) for r in after} == {(0, "k"), (0, "v"), (1, "k"), (1, "v")}


@pytest.mark.parametrize("path", ["attached", "process"])
def test_a_forward_that_raises_is_observed(tiny_model, path):
    g = guard_on(tiny_model, path)

    def boom(module, args, output):
        raise RuntimeError("model failure after the cache updates")

    handle = tiny_model.model.norm.register_forward_hook(boom)
    cache = DynamicCache(config=tiny_model.config)
    try:
        with g.request("r1"), torch.inference_mode(), pytest.raises(RuntimeError, match="model failure"):
            tiny_model(ids_of(6), use_cache=True, **{KW: cache})
        recs = [r for r in g.snapshot().records if r.request_id == "r1"]
        assert instrument.PENDING.get() is None and instrument.ACTIVE.get() is None
    finally:
        handle.remove()
        g.detach()
    assert len(recs) == 2 * tiny_model.config.num_hidden_layers
    assert sum(r.storage_bytes for r in recs) == sum(
        layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes() for layer in cache.layers)


@pytest.mark.parametrize("path", ["attached", "process"])
def test_reset_inside_a_forward_sees_the_earlier_updates_first(tiny_model, path):
    g = guard_on(tiny_model, path)
    cache = DynamicCache(config=tiny_model.config)
    def reset(pending):
        kv = sum(layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes()
                 for layer in cache.layers)
        cache.reset()
        return len(pending), kv

    handle, seen = in_forward(tiny_model, reset)
    try:
        with g.request("r1"), torch.inference_mode():
            tiny_model(ids_of(6), use_cache=True, **{KW: cache})
        events = [e for e in g.ledger.events() if e.request_id == "r1"]
    finally:
        handle.remove()
        g.detach()
    (left, kv_bytes), = seen
    assert left == 0  # the reset flushed the forward's pending updates before its own evict
    evicts = [e for e in events if e.kind == "evict"]
    # a cache first seen in this forward: without the flush the tracker would not know it yet, and the evict
    # would be lost
    assert len(evicts) == 1 and evicts[0].scope == "cache" and evicts[0].cache.startswith("DynamicCache#")
    assert kv_bytes > 0


def test_first_token_latency_is_measured_at_the_second_forward(tiny_model):
    import time

    # warmed up first: a process's first forward pays torch's one-time set-up, which would make the prefill, and
    # so the first-token latency, most of a short generate
    tiny_model.generate(ids_of(8), max_new_tokens=2, min_new_tokens=2, do_sample=False)
    g = Guard().attach(tiny_model)
    try:
        with g.request("r1"):
            t0 = time.perf_counter()
            tiny_model.generate(ids_of(8), max_new_tokens=48, min_new_tokens=48, do_sample=False)
            total = time.perf_counter() - t0
        inits = [e for e in g.ledger.events() if e.kind == "init" and e.request_id == "r1" and e.first_token_s]
    finally:
        g.detach()
    assert inits, "no init event with a first-token latency"
    # from the prefill forward's start to the second forward's start: a small part of 48 decode steps (had
    # it fallen back to the request's end, it would be the whole duration)
    assert 0 < inits[0].first_token_s < 0.6 * total
