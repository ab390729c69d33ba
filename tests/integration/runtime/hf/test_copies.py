"""An attached model copies, pickles, saves and compiles as if kv-guardian were not there (hf.attach): a copy is
not attached and runs its own weights; the original stays attached and its outputs unchanged."""

import copy
import gc
import io
import pickle

import pytest
import torch

from kvguardian.apps.repro.models import TINY, build_llama
from kvguardian.runtime.guard import Guard
from kvguardian.runtime.hf import instrument


def ids_of(seed=0):
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(seed))


def tokens(model, ids):
    return model.generate(ids, max_new_tokens=6, do_sample=False)


def perturb(model):
    """Change every weight (deterministically): a model whose tokens differ from the original's."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


@pytest.fixture
def model():
    return build_llama(TINY)


@pytest.fixture
def attached(model):
    g = Guard(strict=True)
    g.attach(model)
    yield g, model
    g.detach()


def requests_of(guard):
    return len(guard.snapshot().requests)


def assert_audited(guard, model):
    """One generate call of ``model`` is one more request of ``guard``: the model is attached to it."""
    before = requests_of(guard)
    tokens(model, ids_of())
    assert requests_of(guard) == before + 1


def assert_nothing_of_ours(model):
    """No kv-guardian object reachable from the model's own state: its dict, its modules' hooks."""
    assert "generate" not in vars(model)
    for m in model.modules():
        for hooks in (m._forward_pre_hooks, m._forward_hooks):
            assert not any("kvguardian" in getattr(h, "__module__", "") for h in hooks.values())


def test_deepcopy_runs_the_copys_weights_and_is_not_attached(model):
    ids = ids_of()
    expected = tokens(model, ids)
    reference = perturb(copy.deepcopy(model))  # what the copy must do: made before anything is attached
    expected_copy = tokens(reference, ids)
    assert not torch.equal(expected_copy, expected)  # the perturbation changes the tokens
    g = Guard(strict=True)
    g.attach(model)
    try:
        c = perturb(copy.deepcopy(model))
        assert torch.equal(tokens(c, ids), expected_copy)
        before = requests_of(g)
        tokens(c, ids)
        assert requests_of(g) == before  # the copy is not attached: nothing recorded for it
        assert torch.equal(tokens(model, ids), expected)  # the original: attached, unchanged
        assert requests_of(g) == before + 1
        assert_nothing_of_ours(c)
        g.detach()  # detach after copying: both stay right
        assert torch.equal(tokens(c, ids), expected_copy)
        assert torch.equal(tokens(model, ids), expected)
    finally:
        g.detach()


def test_a_copy_can_be_attached_itself(attached):
    g, model = attached
    c = copy.deepcopy(model)
    g.attach(c)  # not "already attached": it is another model
    assert_audited(g, c)


def test_shallow_copy_runs_as_itself(attached):
    g, model = attached
    ids = ids_of(1)
    expected = tokens(model, ids)
    c = copy.copy(model)
    before = requests_of(g)
    assert torch.equal(tokens(c, ids), expected)  # shares the weights
    assert requests_of(g) == before  # not attached
    assert "generate" not in vars(c)


def test_pickle_round_trip_names_nothing_of_kvguardian(attached):
    g, model = attached
    ids = ids_of(2)
    expected = tokens(model, ids)
    data = pickle.dumps(model)
    assert b"kvguardian" not in data  # loads where kv-guardian is not installed
    loaded = pickle.loads(data)
    assert torch.equal(tokens(loaded, ids), expected)
    before = requests_of(g)
    tokens(loaded, ids)
    assert requests_of(g) == before
    assert torch.equal(tokens(model, ids), expected)


def test_torch_save_and_load_round_trip(attached):
    g, model = attached
    ids = ids_of(3)
    expected = tokens(model, ids)
    buf = io.BytesIO()
    torch.save(model, buf)
    assert b"kvguardian" not in buf.getvalue()
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(tokens(loaded, ids), expected)
    assert torch.equal(tokens(model, ids), expected)
    assert requests_of(g) == 2  # the original's two generate calls, not the loaded copy's


def test_trl_style_reference_model_follows_its_own_weights(attached):
    """TRL's create_reference_model: deepcopy, eval, requires_grad False; then the policy trains."""
    _g, policy = attached
    ids = ids_of(4)
    before_training = tokens(policy, ids)
    ref = copy.deepcopy(policy)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad = False
    opt = torch.optim.SGD(policy.parameters(), lr=5.0)
    for _ in range(3):  # a few large steps: the policy's tokens move
        loss = policy(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert not torch.equal(tokens(policy, ids), before_training)
    assert torch.equal(tokens(ref, ids), before_training)  # the reference kept the weights it was copied with


def test_to_returns_the_attached_model(attached):
    g, model = attached
    same = model.to(torch.float32).eval()
    assert same is model
    assert_audited(g, same)


def test_compiled_attached_model_matches_and_fullgraph_compiles(attached):
    """Under dynamo every wrapper passes through: a fullgraph compile of the attached model works as without us."""
    _g, model = attached
    ids = ids_of(5)
    with torch.no_grad():
        expected = model(ids).logits
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        assert torch.equal(compiled(ids).logits, expected)
    torch._dynamo.reset()


def test_compiled_generate_with_a_static_cache(attached):
    """transformers' own auto-compile of decode steps (fullgraph, what it does on a GPU with a static cache)."""
    from transformers import StaticCache
    from transformers.generation.configuration_utils import CompileConfig

    from kvguardian.runtime.hf.compat import cache_kwarg

    g, model = attached
    ids = ids_of(6)
    config = CompileConfig(backend="eager", fullgraph=True)
    config._compile_all_devices = True  # the GPU path, on the CPU

    def run():
        cache = StaticCache(config=model.config, max_cache_len=32)
        return model.generate(ids, max_new_tokens=6, do_sample=False, compile_config=config,
                              **{cache_kwarg(): cache})

    torch._dynamo.reset()
    with g.request("compiled"):
        got = run()
    torch._dynamo.reset()
    ids_plain = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, ids_plain)
    # the uncompiled prefill created the static cache's entries: audited, and released with the cache
    inits = [e for e in g.events() if e.request_id == "compiled" and e.kind == "init" and e.scope == "entry"]
    assert len(inits) == 2 * model.config.num_hidden_layers
    gc.collect()
    assert [r for r in g.snapshot().records if r.request_id == "compiled"] == []


def test_detach_leaves_no_wrapper_and_the_registry_empty(model):
    g = Guard()
    g.attach(model)
    c = copy.deepcopy(model)
    g.detach()
    assert instrument.attached(model) is None and instrument.attached(c) is None
    from transformers import PreTrainedModel
    from transformers.generation.utils import GenerationMixin

    assert "__call__" not in PreTrainedModel.__dict__
    assert not hasattr(GenerationMixin.generate, "__kvguardian_original__")
    Guard().attach(model).detach()  # attachable again


def test_a_collected_model_leaves_the_registry(model):
    g = Guard()
    m = build_llama(TINY)
    g.attach(m)
    key = id(m)
    del m
    gc.collect()
    assert key not in instrument._ATTACHED
    g.detach()
