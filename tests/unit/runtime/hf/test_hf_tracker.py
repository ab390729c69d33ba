"""The transformers source without transformers: the tracker talks only to its host (a `RequestScope` here, no
guard), and a cache with no ``layers`` list goes through the generic path (model tests: integration/hf)."""

import gc

import torch

from kvg_testing import grow_kv
from kvguardian.core.detectors import DetectContext, run_all
from kvguardian.core.ledger import EntryState, Ledger
from kvguardian.runtime.hf.layers import KNOWN_LAYERS
from kvguardian.runtime.hf.observers import OBSERVERS, CacheUpdate
from kvguardian.runtime.hf.tracker import HFTracker
from kvguardian.runtime.sources.scope import RequestScope


class ListCache:
    """A 4.x-style cache: its own lists, no ``layers`` attribute."""

    def __init__(self):
        self.k, self.v = [], []

    def update(self, key_states, value_states, layer_idx):
        return grow_kv(self.k, self.v, key_states, value_states, layer_idx)


def drive(tracker, cache, steps=3, layers=2):
    for _ in range(steps):
        for layer in range(layers):
            new = torch.zeros(1, 2, 1, 8)
            out = cache.update(new, new, layer)
            tracker.on_update(CacheUpdate(cache, layer, new, (), {}, out))


def test_generic_cache_entries_name_the_cache_class():
    scope = RequestScope(Ledger(), strict=True)
    tracker = HFTracker(scope)
    cache = ListCache()
    with scope.request("u"):
        drive(tracker, cache)
    snap = scope.snapshot()
    assert len(snap.records) == 4 and {r.source for r in snap.records} == {"ListCache"}
    assert all(r.shape == (1, 2, 3, 8) and r.state is EntryState.ORPHANED for r in snap.records)
    findings = run_all(snap, DetectContext())
    [orphaned] = [f for f in findings if f.id == "KVG102"]
    assert orphaned.evidence["sources"] == ["ListCache"]  # the cache's class, not the tracker's bookkeeping
    [unknown] = [f for f in findings if f.id == "KVG107"]
    assert unknown.evidence["class"].endswith("test_hf_tracker.ListCache")
    del cache
    gc.collect()
    assert scope.snapshot().records == ()
    assert [e.kind for e in scope.events() if e.scope == "cache"][-1] == "release"


def test_a_cache_driven_outside_any_request_is_one_and_ends_with_the_next():
    scope = RequestScope(Ledger(), strict=True)
    tracker = HFTracker(scope)
    cache = ListCache()
    drive(tracker, cache, steps=1)
    [manual] = [r for r in scope.ledger.snapshot().requests.values() if r.implicit]
    assert manual.request_id == "cache-1" and manual.active
    with scope.request("next"):  # a request starting ends the sources' open implicit requests
        pass
    assert not scope.ledger.request("cache-1").active
    assert {r.state for r in scope.snapshot().records} == {EntryState.ORPHANED}


def test_every_layer_kind_has_an_observer():
    assert set(OBSERVERS) == set(KNOWN_LAYERS.values()) | {"generic"}


def test_the_tracker_is_a_source_of_its_host():
    scope = RequestScope(Ledger())
    tracker = HFTracker(scope)
    assert scope.sources() == (tracker,) and tracker in scope.auditor_objects()


class Result:
    """What a generate call returns: it holds the cache."""

    def __init__(self, cache):
        self.past_key_values = cache


def test_a_request_result_is_a_weak_bounded_search_hint():
    """What a request returned (noted by the generate wrapper) comes back as a hint for its records, weakly: a
    freed result is no hint, a tensor result none at all, and only the latest results are remembered."""
    from kvguardian.runtime.hf import tracker as tracker_mod

    scope = RequestScope(Ledger(), strict=True)
    tracker = HFTracker(scope)
    cache = ListCache()
    with scope.request("u") as info:
        drive(tracker, cache)
    kept = Result(cache)
    tracker.note_result(info, kept)
    records = [r for r in scope.snapshot().records if r.request_id == "u"]
    assert tracker.chain_hints(records) == [kept]  # one per request, however many records it owns
    del kept
    gc.collect()
    assert tracker.chain_hints(records) == []  # weak: the auditor keeps no result alive
    with scope.request("t") as t_info:
        pass
    tracker.note_result(t_info, torch.zeros(2))  # generated token ids hold no cache
    assert "t" not in tracker._results
    held = [Result(None) for _ in range(tracker_mod._MAX_RESULTS + 5)]
    for n, r in enumerate(held):
        with scope.request(f"r{n}") as i:
            pass
        tracker.note_result(i, r)
    assert len(tracker._results) == tracker_mod._MAX_RESULTS and "r0" not in tracker._results
