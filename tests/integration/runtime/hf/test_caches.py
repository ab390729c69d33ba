"""Every cache class of transformers 5.x, observed through the Cache.update hook: what is recorded, how it is
attributed, and what is skipped. Runs on the oldest supported 5.x (.venv-tf50) and the newest (.venv)."""

import gc

import pytest
import torch
import transformers
from transformers import DynamicCache, EncoderDecoderCache, QuantizedCache

from kvg_testing import grow_kv
from kvguardian.core.errors import UsageError
from kvguardian.core.ledger import EntryState
from kvguardian.runtime.guard import Guard
from kvguardian.runtime.hf import layers as hf_layers
from kvguardian.runtime.hf.compat import cache_kwarg, check_transformers_version, output_cache, transformers_version

TF = transformers_version()


def gen(model, ids, **kw):
    return model.generate(ids, do_sample=False, return_dict_in_generate=True, **kw)


def ids_of(n, seed=0):
    return torch.randint(1, 60, (1, n), generator=torch.Generator().manual_seed(seed))


def records_of(guard, request_id):
    return [r for r in guard.snapshot().records if r.request_id == request_id]


def test_dynamic_cache_entries_lifecycle_and_hit(tiny_model):
    g = Guard().attach(tiny_model)
    try:
        with g.request("r1", tenant="acme"):
            out = gen(tiny_model, ids_of(8), max_new_tokens=4)
        cache = output_cache(out)
        recs = records_of(g, "r1")
        assert {(r.layer, r.kind) for r in recs} == {(0, "k"), (0, "v"), (1, "k"), (1, "v")}
        assert all(r.source == "DynamicLayer" and r.shape == (1, 2, 11, 16) for r in recs)
        assert all(r.state is EntryState.ORPHANED and r.tenant == "acme" for r in recs)
        with g.request("r2", tenant="acme"):  # continue the conversation from r1's cache: a hit
            gen(tiny_model, torch.cat([out.sequences, ids_of(5, 1)], 1), max_new_tokens=2,
                **{cache_kwarg(): cache})
        events = [e for e in g.events() if e.scope == "cache"]
        init = [e for e in events if e.kind == "init"]
        hit = [e for e in events if e.kind == "hit"]
        assert len(init) == 1 and init[0].request_id == "r1" and init[0].shape == (1, 2, 8, 16)
        assert init[0].dtype == "torch.float32" and init[0].device == "cpu" and init[0].first_token_s > 0
        assert len(hit) == 1 and hit[0].request_id == "r2" and hit[0].detail == "reused from r1"
        assert hit[0].hit_ratio == pytest.approx(11 / (11 + 6))  # 11 cached tokens, 6 new prompt tokens
        assert hit[0].latency_delta is not None and hit[0].first_token_s > 0
        rate = g.reuse_rate(last=10)
        assert rate["requests"] == 2 and rate["hits"] == 1 and rate["hit_rate"] == 0.5
        assert g.reuse_rate(seconds=3600)["reused_tokens"] == 11
        del cache, out
        gc.collect()
        kinds = [e.kind for e in g.events() if e.scope == "cache"]
        assert kinds[-1] == "release"
        assert g.snapshot().records == ()
    finally:
        g.detach()


def test_manually_driven_cache_is_a_request_and_crop_is_an_evict(tiny_model):
    g = Guard().attach_process()
    try:
        cache = DynamicCache()
        with torch.no_grad():
            tiny_model(ids_of(10), **{cache_kwarg(): cache}, use_cache=True)
            tiny_model(ids_of(1, 2), **{cache_kwarg(): cache}, use_cache=True)
        owners = {r.request_id for r in g.snapshot().records}
        assert len(owners) == 1 and next(iter(owners)).startswith("cache-")
        cache.crop(-5)  # keys become views of the 11-token storages: counted at full size
        snap = g.snapshot()
        assert all(r.logical_bytes * 11 == r.storage_bytes * 6 for r in snap.records)
        acc = g.summary()["kv"]
        assert acc["cropped_views"]["entries"] == 4 and acc["cropped_views"]["view_bytes"] * 11 == \
            acc["cropped_views"]["storage_bytes"] * 6
        evict = [e for e in g.events() if e.scope == "cache" and e.kind == "evict"]
        assert len(evict) == 1 and evict[0].detail == "crop(-5)"
        report = g.check(end_implicit=True)
        assert [f.severity.value for f in report.by_id("KVG102")] == ["info"]  # a local variable: bounded
    finally:
        g.detach_process()


def test_static_cache_allocated_vs_filled(tiny_model):
    g = Guard().attach(tiny_model)
    try:
        with g.request("s1"):
            out = gen(tiny_model, ids_of(6), max_new_tokens=5, cache_implementation="static")
        cache = output_cache(out)
        assert type(cache).__name__ == "StaticCache"
        recs = records_of(g, "s1")
        cap = cache.layers[0].max_cache_len
        assert recs and all(r.capacity_tokens == cap and r.source == "StaticLayer" for r in recs)
        assert all(r.filled_tokens == 10 for r in recs), [r.filled_tokens for r in recs]  # 6 prompt + 4 fed back
        static = g.summary()["kv"]["static"]
        assert static["fragmentation_ratio"] == pytest.approx(1 - 10 / cap, abs=1e-6)
        assert static["filled_bytes"] * cap == static["allocated_bytes"] * 10
    finally:
        g.detach()


def _mistral(sliding):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=sliding, pad_token_id=0)
    torch.manual_seed(0)
    return MistralForCausalLM(cfg).eval()


@pytest.mark.parametrize("impl", ["dynamic", "static"])
def test_sliding_window_layers_from_the_config(impl):
    model = _mistral(sliding=4)
    g = Guard().attach(model)
    try:
        with g.request("w"):
            kw = {"cache_implementation": "static"} if impl == "static" else {}
            out = gen(model, ids_of(7), max_new_tokens=4, **kw)
        recs = records_of(g, "w")
        expected = "DynamicSlidingWindowLayer" if impl == "dynamic" else "StaticSlidingWindowLayer"
        assert {r.source for r in recs} == {expected}
        if impl == "static":
            assert all(r.capacity_tokens == 4 and r.filled_tokens == 4 for r in recs)
        else:  # the window is a view of a larger storage: the storage is what is counted
            assert all(r.storage_bytes >= r.logical_bytes for r in recs)
        assert output_cache(out) is not None
    finally:
        g.detach()


@pytest.mark.skipif(TF < (5, 21), reason="QuantizedCache(backend='fp8') appears in transformers 5.21")
def test_fp8_quantized_cache(tiny_model):
    g = Guard().attach(tiny_model)
    try:
        cache = QuantizedCache(backend="fp8", config=tiny_model.config)
        with g.request("q"):
            gen(tiny_model, ids_of(6), max_new_tokens=4, **{cache_kwarg(): cache})
        recs = records_of(g, "q")
        assert {r.source for r in recs} == {"Fp8QuantizedLayer"}
        assert {r.dtype for r in recs} == {"torch.float8_e4m3fn"}
        assert all(r.shape[-2] == 9 and r.storage_bytes == 2 * 9 * 16 for r in recs)  # 1 byte per element
    finally:
        g.detach()


def test_quanto_quantized_cache(tiny_model):
    """The real quanto backend (optimum-quanto, a dev extra; it runs on CPU): packed 4-bit states and their
    scales/shifts are entries of their own, beside the original-precision residual."""
    pytest.importorskip("optimum.quanto")
    g = Guard().attach(tiny_model)
    try:
        cache = QuantizedCache(backend="quanto", config=tiny_model.config, nbits=4, residual_length=4)
        with g.request("q4"):
            gen(tiny_model, ids_of(6), max_new_tokens=7, **{cache_kwarg(): cache})
        recs = records_of(g, "q4")
        assert {r.source for r in recs} == {"QuantoQuantizedLayer"}
        assert {r.kind for r in recs} == {"k", "v", "qk", "qv"}
        assert "torch.uint8" in {r.dtype for r in recs if r.kind == "qk"}  # 4-bit values, packed
        assert {r.layer for r in recs} == {0, 1}
        assert not g.hf_tracker().unknown
        del cache
        assert g.check().findings == []
    finally:
        g.detach()


def test_group_quantized_layer_residual_and_states(tiny_model):
    """A test-local int8 backend on transformers' QuantizedLayer: the same path as quanto/hqq (hqq is not
    installable here: source-only, CUDA-oriented), the original-precision residual every step, the quantized
    states when they change."""
    from transformers.cache_utils import Cache, QuantizedLayer

    class Int8Layer(QuantizedLayer):
        def __init__(self):
            super().__init__(nbits=8, residual_length=4)

        def _quantize(self, tensor, axis=0):
            scale = tensor.abs().amax().clamp(min=1e-8) / 127
            return (tensor / scale).round().to(torch.int8), scale

        def _dequantize(self, q):
            return q[0].float() * q[1]

    cache = Cache(layers=[Int8Layer() for _ in range(tiny_model.config.num_hidden_layers)])
    g = Guard().attach(tiny_model)
    try:
        with g.request("q8"):
            gen(tiny_model, ids_of(6), max_new_tokens=7, **{cache_kwarg(): cache})
        recs = records_of(g, "q8")
        assert {r.source for r in recs} == {"Int8Layer"}
        assert {"qk", "qv"} <= {r.kind for r in recs} and "torch.int8" in {r.dtype for r in recs}
        assert not g.hf_tracker().unknown, "a subclass of a known layer is known"
    finally:
        g.detach()


def test_encoder_decoder_cache_self_and_cross_attribution():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                             num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                                             pad_token_id=0)).eval()
    g = Guard().attach(t5)
    try:
        with g.request("ed", tenant="t"):
            out = gen(t5, ids_of(7), max_new_tokens=3)
        cache = output_cache(out)
        assert isinstance(cache, EncoderDecoderCache)
        recs = records_of(g, "ed")
        roles = {r.role for r in recs}
        assert roles == {"self", "cross"}
        cross = [r for r in recs if r.role == "cross"]
        assert all(r.shape == (1, 4, 7, 8) for r in cross)  # the encoder's 7 tokens
        assert {r.cache.rsplit(".", 1)[1] for r in recs} == {"self", "cross"}
        assert set(g.summary()["kv"]["by_role"]) == {"self", "cross"}
    finally:
        g.detach()


def test_linear_attention_and_dummy_layers_are_skipped_with_a_reason():
    from transformers import cache_utils

    if not hasattr(cache_utils, "LinearAttentionLayer"):
        pytest.skip("linear-attention layers appear in transformers 5.5")
    made = [cache_utils.DynamicLayer(), cache_utils.LinearAttentionLayer()]
    if hasattr(cache_utils, "DummyLayer"):
        made.append(cache_utils.DummyLayer())
    cache = cache_utils.Cache(layers=made)
    g = Guard().attach_process()
    try:
        with g.request("lin"):
            k = torch.zeros(1, 2, 3, 8)
            cache.update(k, k, 0)
        info = g.hf_tracker().classify(cache)
        kinds = [layer["kind"] for layer in info["layers"]]
        assert kinds[:2] == ["dynamic", "linear"] and (len(kinds) == 2 or kinds[2] == "dummy")
        skipped = g.summary()["hf"]["skipped_layers"]
        assert "not a per-token KV cache" in skipped["LinearAttentionLayer"]
        if len(made) == 3:
            assert "stores no cache" in skipped["DummyLayer"]
        assert {r.layer for r in records_of(g, "lin")} == {0}
    finally:
        g.detach_process()


def test_unknown_cache_class_is_audited_through_the_generic_path_with_a_warning():
    from transformers.cache_utils import Cache

    class ListCache(Cache):  # 4.x style: its own storage, its own update, no `layers`
        def __init__(self):
            super().__init__(layer_class_to_replicate=hf_layers.__class__)  # any class: never used
            self.layers = None
            self.k, self.v = [], []

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            return grow_kv(self.k, self.v, key_states, value_states, layer_idx)

    g = Guard().attach_process()
    try:
        cache = ListCache()
        with g.request("u"):
            for _ in range(3):
                for layer in range(2):
                    cache.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), layer)
        recs = records_of(g, "u")
        assert len(recs) == 4 and all(r.shape == (1, 2, 3, 8) for r in recs)
        report = g.check()
        warn = report.by_id("KVG107")
        assert len(warn) == 1 and warn[0].severity.value == "warning" and "ListCache" in warn[0].message
        [orphaned] = report.by_id("KVG102")  # the generic path still proves the orphaned KV
        assert orphaned.evidence["sources"] == ["ListCache"]  # the cache's class (it has no layer classes)
    finally:
        g.detach_process()


def test_versions_and_bad_input(tiny_model):
    assert check_transformers_version() == transformers.__version__
    with pytest.raises(UsageError, match=r"transformers 4\.57\.1 is not supported; kv-guardian needs "
                                         r"transformers >= 5\.0; fix: pip install 'transformers>=5,<6'") as ei:
        check_transformers_version("4.57.1")
    assert ei.value.exit_code == 3
    with pytest.raises(UsageError, match="not a transformers PreTrainedModel; fix: for a custom torch model"):
        Guard().attach(torch.nn.Linear(2, 2))
    with pytest.raises(UsageError, match="already attached"):
        g = Guard().attach(tiny_model)
        try:
            Guard().attach(tiny_model)
        finally:
            g.detach()
    assert cache_kwarg() == ("cache" if TF >= (5, 24) else "past_key_values")


def counting_guard():
    """A guard whose ledger counts the observations the tracker's observers make, and the tensors in them (every
    decode forward observed: `hf.sampling` is tested in test_decode_sampling.py)."""
    g = Guard(decode_stride=1)
    calls = {"observe_kv": 0, "observe": 0, "touch_kv": 0, "tensors": 0}
    observe_kv, observe, touch_kv = g.ledger.observe_kv, g.ledger.observe, g.ledger.slots.touch

    def counted_kv(keys, values, *args):
        calls["observe_kv"] += 1
        calls["tensors"] += 1 + (values is not None)
        return observe_kv(keys, values, *args)

    def counted(tensor, *args):
        calls["observe"] += 1
        calls["tensors"] += 1
        return observe(tensor, *args)

    def counted_touch(*args):  # the same tensors as last time: none read
        calls["touch_kv"] += 1
        return touch_kv(*args)

    # the instance's: what the observers call
    g.ledger.observe_kv, g.ledger.observe, g.ledger.slots.touch = counted_kv, counted, counted_touch
    return g, calls


@pytest.mark.parametrize("impl", ["dynamic", "static"])
def test_hooks_do_not_change_results_and_cost_o1_per_layer(tiny_model, impl):
    """One tracker call per layer per forward, and per call one paired ledger observation, of two tensors or (a
    static cache's decode steps: the same tensor objects, grad mode off) of none, however long the sequence is:
    nothing walks the cache."""
    layers = tiny_model.config.num_hidden_layers
    kw = {"cache_implementation": "static"} if impl == "static" else {}
    per_update = {}
    for new_tokens in (4, 40):
        ids = ids_of(9)
        plain = gen(tiny_model, ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw).sequences
        g, calls = counting_guard()
        g.attach(tiny_model)
        try:
            guarded = gen(tiny_model, ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw).sequences
            updates = g.hf_tracker().updates
        finally:
            g.detach()
        assert torch.equal(plain, guarded)
        assert updates == layers * new_tokens  # 1 prefill + (new_tokens - 1) decode forwards, every layer
        per_update[new_tokens] = {k: v / updates for k, v in calls.items()}
    for new_tokens, per in per_update.items():
        # the prefill reads both tensors of every layer; a static cache's decode steps read none
        touched = (new_tokens - 1) / new_tokens if impl == "static" else 0.0
        assert per == pytest.approx({"observe_kv": 1.0 - touched, "touch_kv": touched, "observe": 0.0,
                                     "tensors": 2.0 * (1.0 - touched)})
