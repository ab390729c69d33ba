"""A frontier object that only other frontier objects hold is left out of the heap scan when the reference
counts prove it (`tensors/holders/refcounts`): the same chains, a smaller scan, and a reference from
anywhere else always found."""

import gc
import sys

import pytest
import torch

from kvg_testing import fake_module
from kvguardian.core.tensors.holders import find_holder_chains
from kvguardian.core.tensors.holders.refcounts import fully_accounted
from kvguardian.core.tensors.storage import storage_key

search_mod = sys.modules["kvguardian.core.tensors.holders.search"]


@pytest.fixture
def app():
    with fake_module("refcount_app") as mod:
        yield mod


class Output:
    """What a request returns: it holds the request's cache."""

    def __init__(self, cache):
        self.past_key_values = cache


def _sessions(app, n):
    app.SESSIONS = {}
    for i in range(n):
        out = Output([torch.zeros(1, 2, 4, 8)])
        vars(out)  # the instance dict exists: one more frontier object between the output and its cache
        app.SESSIONS[f"s{i}"] = out


def _seeds(app):
    return {storage_key(o.past_key_values[0]): o.past_key_values for o in app.SESSIONS.values()}


def _scan_sizes(monkeypatch):
    """How many objects each heap scan of the search asks about."""
    real = gc.get_referrers
    sizes = []

    def counted(*objs):
        sizes.append(len(objs))
        return [r for r in real(*objs) if not _same_tuple(r, objs)]  # the calls' argument tuples are no holders

    monkeypatch.setattr(search_mod.gc, "get_referrers", counted)
    return sizes


def _same_tuple(r, objs):
    return type(r) is tuple and len(r) == len(objs) and all(a is b for a, b in zip(r, objs))


def _search(app, keys):
    chains = find_holder_chains(keys, seeds=_seeds(app), hints=list(app.SESSIONS.values()))
    return [(chains[k].complete, chains[k].steps, chains[k].sizes == {} or sorted(chains[k].sizes.values()))
            for k in keys]


def _with_and_without_shortcuts(app, monkeypatch, n):
    """The chains of ``n`` sessions and the scans' sizes, as searched, then with every scan a full one."""
    monkeypatch.setattr(search_mod, "_PROBING", [True])
    _sessions(app, n)
    keys = list(_seeds(app))
    sizes = _scan_sizes(monkeypatch)
    short = _search(app, keys)
    asked = list(sizes)
    sizes.clear()
    monkeypatch.setattr(search_mod, "held_within", lambda frontier: set())
    monkeypatch.setattr(search_mod, "_PROBING", [False])
    return short, asked, _search(app, keys), sizes


def test_objects_held_only_by_the_frontier_are_left_out_and_no_chain_changes(app, monkeypatch):
    short, asked, full, sizes = _with_and_without_shortcuts(app, monkeypatch, 6)
    assert short == full
    assert all(c and s[0] == "module refcount_app: SESSIONS" for c, s, _ in short)
    # outputs, their dicts, the caches: 18 objects; only the 6 outputs have referrers outside the frontier
    assert asked == [6] and sizes == [18]


def test_a_reference_from_outside_the_frontier_is_never_missed(app):
    """One cache is also held by a dict nothing in the frontier knows: its count does not add up, the scan
    asks about it after all, and that shorter chain wins."""
    _sessions(app, 3)
    app.OTHER = {"direct": app.SESSIONS["s1"].past_key_values}
    keys = list(_seeds(app))
    steps = {k: s for k, (_, s, _) in zip(keys, _search(app, keys))}
    assert steps[keys[1]][:2] == ["module refcount_app: OTHER", "dict['direct']"]
    assert steps[keys[0]][0] == steps[keys[2]][0] == "module refcount_app: SESSIONS"


def test_a_reference_the_collector_cannot_show_keeps_the_full_scan(app, monkeypatch):
    """A local of an executing frame refers to a cache (the collector does not show executing frames): the
    count is short, every scan is a full one, and the frame is the chain's root."""
    _sessions(app, 2)
    held_here = app.SESSIONS["s0"].past_key_values
    keys = list(_seeds(app))
    sizes = _scan_sizes(monkeypatch)
    steps = [s for _, s, _ in _search(app, keys)]
    assert sizes[-1] == 6
    assert steps[0][0].startswith("frame ") and "held_here" in steps[0][0]
    assert held_here is app.SESSIONS["s0"].past_key_values


def test_fully_accounted_counts_each_holder_once():
    objs = [object()]  # no local variable of this (executing) frame refers to it: only containers do
    in_list, in_dict = [objs[0]], {"k": objs[0]}
    assert fully_accounted(objs, [in_list, in_dict])
    assert not fully_accounted(objs, [in_list])  # the dict's reference is not counted
    assert not fully_accounted(objs, [in_list, in_list])  # a holder twice is still one reference
    del in_dict
    assert fully_accounted(objs, [in_list]) and not fully_accounted(objs, [])


def _keep_from_c(cache):
    """Two outputs sharing one cache, held only by the atexit registry (C): no Python root reaches it."""
    import atexit

    outs = [Output(cache), Output(cache)]
    for o in outs:
        vars(o)
    atexit.register(print, *outs)
    return outs


def test_a_chain_no_root_reaches_is_the_same_as_with_full_scans(monkeypatch):
    """The chain of an unreached start may depend on the order its parents were linked: when two of them
    have one type, the search runs again with full scans (the same chain as without the shortcut)."""
    import atexit

    cache = [torch.zeros(1, 2, 4, 8)]
    key = storage_key(cache[0])
    hints = _keep_from_c(cache)
    seeds = [{key: cache}]
    del cache
    try:
        runs = []
        sizes = _scan_sizes(monkeypatch)
        short = find_holder_chains([key], seeds=seeds[0], hints=hints)[key]
        runs.append(list(sizes))
        sizes.clear()
        monkeypatch.setattr(search_mod, "held_within", lambda frontier: set())
        full = find_holder_chains([key], seeds=seeds[0], hints=hints)[key]
    finally:
        atexit.unregister(print)
    assert not short.complete and short.steps == full.steps and short.notes == full.notes
    assert runs[0][0] < sizes[0] and len(runs[0]) > len(sizes)  # the shortcut's scan, then the full run


def test_many_outputs_of_one_collection_are_probed_with_a_few_and_no_chain_changes(app, monkeypatch):
    """24 outputs in one dict: the scan asks about the last 4; the dict it finds holds the other 20, whose
    counts it proves. Same chains as full scans."""
    probed, asked, full, sizes = _with_and_without_shortcuts(app, monkeypatch, 24)
    assert probed == full and asked == [search_mod._PROBE] and sizes == [72]
    assert all(c and s[0] == "module refcount_app: SESSIONS" for c, s, _ in probed)


def test_a_probe_whose_counts_do_not_prove_the_rest_scans_in_full(app, monkeypatch):
    """One of the outputs left out of the probe is also held by another dict: the counts do not add up, the
    level is scanned in full, that output's chain runs through the other dict, and probing stops."""
    monkeypatch.setattr(search_mod, "_PROBING", [True])
    _sessions(app, 24)
    app.PINNED = {"first": app.SESSIONS["s0"]}
    keys = list(_seeds(app))
    sizes = _scan_sizes(monkeypatch)
    steps = {k: s for k, (_, s, _) in zip(keys, _search(app, keys))}
    assert sizes[:2] == [search_mod._PROBE, 72] and search_mod._PROBING == [False]
    assert steps[keys[0]][0] in ("module refcount_app: PINNED", "module refcount_app: SESSIONS")
    assert {s[0] for s in steps.values()} >= {"module refcount_app: SESSIONS"}
