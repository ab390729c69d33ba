"""The guard wired into the paged mini engine (preemption and shedding under pressure, tokens still equal
HF generate) and into Hugging Face transformers (the bounded prefix cache evicts; a request's first cache
update samples)."""

import copy

import pytest

from kvg_oom import Knob
from kvg_testing import paged_workload
from kvguardian.apps.repro.cross_request import one_thread
from kvguardian.ops.oom.engine import guard_engine
from kvguardian.ops.oom.guard import OOMGuard
from kvguardian.ops.oom.hf_cache import BoundedPrefixCache, cache_nbytes
from kvguardian.runtime.guard import Guard
from kvguardian.runtime.paged import PagedKVPool
from kvguardian.runtime.paged.engine import Engine, OwnershipScheduler


@pytest.fixture(scope="module")
def work(tiny_model):
    return paged_workload(tiny_model, 8, seed=11, sys_tokens=(24, 40))


def test_preemption_under_pressure_recomputes_and_loses_nothing(work):
    model, reqs, expected, eos = work
    pool = PagedKVPool(128, 16, model.spec, debug=True, on_fault="raise")
    engine = Engine(model, OwnershipScheduler(pool), max_num_seqs=6, eos_token_id=eos)
    knob = Knob("kv_budget", used=950)  # a KV budget under pressure the whole run: every sample preempts one request
    oom = guard_engine(OOMGuard([knob], allocate_gap=0.0, release=False), engine, preempt=True, shed=False)
    oom._pool_steps.clear()  # only preemption can act here
    for r in reqs:
        engine.submit(r)
    ended = []
    with one_thread():
        while engine.has_work:
            ended += engine.step()
    assert {s.rid: s.output for s in ended} == expected
    assert oom.preempted > 0 and engine.preemptions > 0
    assert all(s.error is None for s in ended) and pool.check_invariants() == []


def test_shedding_ends_the_newest_requests_with_an_error_and_frees_their_blocks(work):
    model, reqs, expected, eos = work
    pool = PagedKVPool(128, 16, model.spec, debug=True, on_fault="raise")
    engine = Engine(model, OwnershipScheduler(pool), max_num_seqs=6, eos_token_id=eos)
    knob = Knob("cgroup", used=100)
    oom = guard_engine(OOMGuard([knob], release=False), engine)
    seqs = [engine.submit(r, arrival=float(i)) for i, r in enumerate(reqs)]
    with one_thread():
        engine.step()
        knob.used = 980
        oom.sample()  # draining
        knob.used = 995
        oom.sample()  # still rising: shed the newest
        knob.used = 900  # the shed request's memory came back
        ended = []
        while engine.has_work:
            ended += engine.step()
    shed = [s for s in ended if s.error]
    assert [s.rid for s in shed] == [seqs[-1].rid] and "shed under memory pressure" in shed[0].error
    done = {s.rid: s.output for s in ended if not s.error}
    assert done == {k: v for k, v in expected.items() if k != seqs[-1].rid}
    assert pool.check_invariants() == [] and pool.metrics()["blocks_referenced"] == 0


def test_bounded_prefix_cache_evicts_lru_under_pressure_and_forks_give_the_same_tokens(tiny_model):
    import torch

    from kvguardian.runtime.hf.compat import cache_kwarg, output_cache

    knob = Knob("cgroup", used=0, limit=10_000_000)
    guard = Guard()
    oom = OOMGuard([knob], release=False).watch_guard(guard, hf_hook=False)
    prefixes = BoundedPrefixCache(max_entries=3, guard=guard)

    def encode(ids):
        with torch.no_grad():
            return output_cache(tiny_model(input_ids=torch.tensor([ids]), use_cache=True))

    systems = [list(range(1 + i, 30 + i)) for i in range(4)]
    for s in systems:
        prefixes.put(tuple(s), encode(s))
    assert len(prefixes) == 3 and tuple(systems[0]) not in prefixes  # the entry bound (LRU)
    one = prefixes.nbytes // len(prefixes)
    assert prefixes.nbytes == 3 * one == 3 * cache_nbytes(encode(systems[3]))
    knob.limit = int(one / 0.031)  # 3 % of the limit (evict 0.92 -> target 0.89) is about one entry
    knob.used = int(0.921 * knob.limit)  # pressure: the guard asks the retained cache for bytes
    freed_before = prefixes.evicted
    oom.sample()
    assert prefixes.evicted > freed_before and oom.evictions["retained:HF prefix cache (bounded LRU)"] == 1
    assert tuple(systems[1]) not in prefixes and tuple(systems[3]) in prefixes  # the least recently used went
    kw = cache_kwarg()
    prompt = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        a = tiny_model(input_ids=prompt, use_cache=True, **{kw: prefixes.fork(tuple(systems[3]))}).logits
        b = tiny_model(input_ids=prompt, use_cache=True, **{kw: encode(systems[3])}).logits
    assert torch.equal(a, b)
    before = copy.copy(prefixes.nbytes)
    assert prefixes.fork(tuple(systems[3])) is not prefixes.get(tuple(systems[3])) and prefixes.nbytes == before


def test_a_requests_first_cache_update_samples(tiny_model):
    import torch

    guard = Guard()
    oom = OOMGuard([Knob("cgroup")], allocate_gap=0.0).watch_guard(guard)
    guard.attach(tiny_model)
    try:
        for i in range(3):
            with guard.request(f"r{i}"), torch.no_grad():
                tiny_model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=4, do_sample=False)
    finally:
        guard.detach()
    assert oom.samples["allocate"] == 3  # once per request, not once per layer or step
