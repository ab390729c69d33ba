"""``copy.deepcopy`` of a cache under kv-guardian: the same copy as without it, and a copy that is never updated
(a snapshot kept "to resume later") is still audited, as the KV of the request whose cache it copies."""

import copy
import gc

import pytest
import torch
from transformers import cache_utils

from kvguardian.apps.repro.models import TINY, build_llama
from kvguardian.core.ledger import EntryState
from kvguardian.runtime.guard import Guard
from kvguardian.runtime.hf.compat import cache_kwarg, output_cache
from kvguardian.runtime.hf.tracker import HFTracker


@pytest.fixture(scope="module")
def model():
    return build_llama(TINY)


def generate(model, seed=0, **kw):
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(seed))
    return model.generate(ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True, **kw)


def layer_tensors(cache):
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def last_request(snap):
    return list(snap.requests)[-1]


def of_cache(snap, cache):
    return [r for r in snap.records if isinstance(r.slot, tuple) and r.slot[0] == id(cache)]


@pytest.fixture
def guard():
    g = Guard().attach_process()
    yield g
    g.detach_process()


def test_a_deep_copy_is_the_copy_python_makes_without_kvguardian(model):
    cache = output_cache(generate(model))
    plain = copy.deepcopy(cache)
    assert "__deepcopy__" not in cache_utils.Cache.__dict__
    g = Guard().attach_process()
    try:
        ours = copy.deepcopy(cache)
        twice = copy.deepcopy([cache, cache])  # the memo: one copy, twice
    finally:
        g.detach_process()
    assert "__deepcopy__" not in cache_utils.Cache.__dict__  # uninstalled with the patch
    assert type(ours) is type(plain) and len(ours.layers) == len(plain.layers)
    assert [type(la) for la in ours.layers] == [type(la) for la in plain.layers]
    for a, b, orig in zip(layer_tensors(ours), layer_tensors(plain), layer_tensors(cache)):
        assert torch.equal(a, b) and a.untyped_storage().data_ptr() != orig.untyped_storage().data_ptr()
    assert twice[0] is twice[1] and twice[0] is not cache
    assert vars(ours).keys() == vars(plain).keys()


def test_a_kept_copy_never_updated_is_the_original_requests_kv(model, guard):
    out = generate(model, 1)
    kept = copy.deepcopy(output_cache(out))
    owner = last_request(guard.snapshot())
    del out
    gc.collect()
    recs = of_cache(guard.snapshot(), kept)
    assert len(recs) == 2 * len(kept.layers)
    assert {r.request_id for r in recs} == {owner}
    assert {r.state for r in recs} == {EntryState.ORPHANED}  # alive after its request ended, nothing declared it
    keys = {t.untyped_storage().data_ptr() for t in layer_tensors(kept)}
    assert {r.key for r in recs} == keys
    del kept
    gc.collect()
    assert not [r for r in of_cache(guard.snapshot(), recs[0]) if r.state is not EntryState.RELEASED]


def test_a_copy_used_by_a_later_request_is_tracked_once_as_that_requests(model, guard):
    prefix = output_cache(generate(model, 2))
    dup = copy.deepcopy(prefix)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(2))
    out = model.generate(ids, max_new_tokens=2, do_sample=False, return_dict_in_generate=True,
                         **{cache_kwarg(): dup})
    snap = guard.snapshot()
    recs = [r for r in of_cache(snap, dup) if r.state is not EntryState.RELEASED]
    assert len(recs) == 2 * len(dup.layers)
    assert {r.request_id for r in recs} == {last_request(snap)}
    del out


def test_an_error_noting_a_copy_never_reaches_the_program(model, guard, monkeypatch):
    cache = output_cache(generate(model, 3))

    def broken(self, original, dup):
        raise RuntimeError("injected")

    monkeypatch.setattr(HFTracker, "note_copy", broken)
    dup = copy.deepcopy(cache)
    assert all(torch.equal(a, b) for a, b in zip(layer_tensors(dup), layer_tensors(cache)))
    assert guard.summary()["instrumentation_errors"] >= 1


def test_a_model_that_dies_attached_takes_its_use_of_the_patch_with_it():
    """A model garbage-collected while attached (never detached) no longer keeps the class-level patch installed
    for the rest of the process (it did: every later Cache.update of the process went through the wrapper, and a
    later test's "nothing is patched" check failed in CI)."""
    from engine_fakes import wait_until

    assert "__deepcopy__" not in cache_utils.Cache.__dict__
    g = Guard()
    doomed = build_llama(TINY)
    g.attach(doomed)
    assert "__deepcopy__" in cache_utils.Cache.__dict__
    del doomed
    gc.collect()
    assert wait_until(lambda: "__deepcopy__" not in cache_utils.Cache.__dict__, timeout=10)
    g.detach()  # the dead model's attachment is already gone: nothing to drop twice
    assert "__deepcopy__" not in cache_utils.Cache.__dict__
