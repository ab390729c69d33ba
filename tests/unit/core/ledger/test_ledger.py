import gc
import threading
import weakref

import pytest
import torch

from kvguardian.core.errors import UsageError
from kvguardian.core.ledger import EntrySite, EntryState, Ledger


def kinds(ledger):
    return [e.kind for e in ledger.events()]


def test_release_at_storage_death_not_tensor_death():
    led = Ledger()
    req = led.begin_request("r1")
    t = torch.zeros(4, 256)
    view = t[:1]
    rec = led.observe(t, EntrySite(kind="k", layer=0, source="test"), req)
    assert rec is not None and rec.storage_bytes == 4 * 256 * 4
    del t
    gc.collect()
    assert len(led) == 1, "a view keeps the storage alive: not released yet"
    del view
    assert len(led) == 0
    assert led.totals().released_entries == 1 and led.totals().released_bytes == 4096
    assert kinds(led) == ["init", "release"]


def test_views_and_detach_are_one_entry_counted_once():
    led = Ledger()
    t = torch.zeros(2, 2, 10, 8)
    a = led.observe(t, EntrySite(kind="k", layer=0, source="test"), None)
    b = led.observe(t[..., :5, :], EntrySite(kind="k", layer=0, source="test"), None)
    c = led.observe(t.detach(), EntrySite(kind="k", layer=0, source="test"), None)
    assert a is b is c
    snap = led.snapshot()
    assert len(snap.records) == 1 and snap.total_bytes() == t.numel() * 4
    # the last view was the full tensor again: logical == storage
    assert snap.records[0].logical_bytes == t.numel() * 4


def test_cropped_view_counts_full_storage_and_fragmentation():
    led = Ledger()
    t = torch.zeros(1, 2, 100, 8)
    kept = t[..., :25, :]
    del t
    led.observe(kept, EntrySite(kind="k", layer=0, source="test"), None)
    snap = led.snapshot()
    assert snap.total_bytes() == 1 * 2 * 100 * 8 * 4
    assert snap.fragmentation_ratio() == pytest.approx(0.75)


def test_ledger_holds_no_strong_reference():
    led = Ledger()
    t = torch.ones(1000)
    ref = weakref.ref(t)
    led.observe(t, EntrySite(kind="v", layer=3, source="test"), None)
    del t
    assert ref() is None
    assert len(led) == 0


def test_event_buffer_is_bounded_and_counts_drops():
    led = Ledger(event_capacity=10)
    keep = []
    for i in range(25):
        t = torch.zeros(8)
        keep.append(t)
        led.observe(t, EntrySite(kind="k", layer=i, source="test"), None)
    assert len(led.events()) == 10
    assert led.totals().events_dropped == 15
    assert len(led.take_events()) == 10 and led.events() == []


def test_owner_end_orphans_retained_and_hit_moves_ownership():
    led = Ledger()
    r1 = led.begin_request("r1", tenant="a")
    a, b = torch.zeros(16), torch.zeros(16)
    led.observe(a, EntrySite(kind="k", layer=0, source="test"), r1)
    led.observe(b, EntrySite(kind="v", layer=0, source="test"), r1)
    led.retain_keys([b.untyped_storage().data_ptr()], "prefix")
    led.end_request("r1")
    states = {r.kind: r.state for r in led.snapshot().records}
    assert states == {"k": EntryState.ORPHANED, "v": EntryState.RETAINED}
    assert led.snapshot().residency_ratio() == 1.0
    r2 = led.begin_request("r2", tenant="b")
    rec = led.observe(a, EntrySite(kind="k", layer=0, source="test"), r2)
    assert rec.state is EntryState.LIVE and rec.request_id == "r2" and rec.tenant == "b"
    assert "hit" in kinds(led)
    led.check_invariants()
    with pytest.raises(UsageError, match="request 'r1' is not active"):
        led.end_request("r1")
    with pytest.raises(UsageError, match="already active"):
        led.begin_request("r2")


def test_slot_replacement_is_append_not_release():
    led = Ledger()
    req = led.begin_request("r")
    k = torch.zeros(1, 2, 1, 4)
    for _ in range(5):
        k = torch.cat([k, torch.zeros(1, 2, 1, 4)], dim=2)  # the old storage dies here
        led.observe(k, EntrySite(kind="k", layer=0, source="DynamicLayer", slot=("c", 0, "k")), req)
    # appends are coalesced per entry and owner: one in the buffer, all of them counted
    assert kinds(led) == ["init", "append"]
    assert led.snapshot().event_counts["append"] == 4
    del k
    assert kinds(led)[-1] == "release"
    assert led.snapshot().event_counts["release"] == 1


def test_release_from_another_thread():
    led = Ledger()
    box = [torch.zeros(64)]
    led.observe(box[0], EntrySite(kind="k", layer=0, source="test"), None)
    th = threading.Thread(target=box.clear)
    th.start()
    th.join()
    assert len(led) == 0
    led.check_invariants()


def test_ended_bytes_series_sampled_per_request():
    led = Ledger()
    keep = []
    for i in range(3):
        req = led.begin_request(f"r{i}")
        t = torch.zeros(10)
        keep.append(t)
        led.observe(t, EntrySite(kind="k", layer=0, source="test"), req)
        led.end_request(f"r{i}")
    assert [b for (_, _, b) in led.snapshot().retained_series] == [40, 80, 120]
    keep.clear()
    del t
    led.check_invariants()
    assert led.snapshot().bytes_by_state()["orphaned"] == 0


#: what sources and readers need (issue 30 cut 44 names to these); a new public name is a decision, made here
SURFACE = {
    "clock", "generation", "begin_request", "end_request", "request", "bump_generation",  # requests
    "observe", "observe_kv", "begin_batch", "end_batch",  # tensor entries
    "add_entry", "touch_entry", "release_entry",  # any other entry
    "retain_keys", "clear_retention",  # declared retention
    "slots", "notes",  # the two facets sources use
    "records", "snapshot", "timeline", "totals", "events", "take_events", "check_invariants",  # reading
}


def test_the_ledger_s_public_surface_is_what_sources_and_readers_need():
    led = Ledger()
    public = {n for n in dir(led) if not n.startswith("_")}
    assert public == SURFACE, f"added: {sorted(public - SURFACE)}, removed: {sorted(SURFACE - public)}"


def test_every_old_name_warns_names_its_replacement_and_still_works():
    from kvguardian.core.ledger.renamed import RENAMED

    led = Ledger()
    req = led.begin_request("r")
    t = torch.zeros(4, 8)
    for name, (replacement, _get) in RENAMED.items():
        with pytest.warns(DeprecationWarning, match=rf"Ledger\.{name} is deprecated; use Ledger\."):
            getattr(led, name)
        assert replacement.split("(")[0].split(".")[0].strip("{") in SURFACE | {"r"}, replacement
    with pytest.warns(DeprecationWarning):
        rec = led.observe_tensor(t, kind="k", layer=0, request=req, source="old", filled_tokens=2,
                                 capacity_tokens=4)
    assert rec is not None and rec.source == "old" and rec.filled_tokens == 2
    with pytest.warns(DeprecationWarning):
        assert led.live_keys() == {t.untyped_storage().data_ptr()}
    with pytest.warns(DeprecationWarning):
        assert led.slot_bytes([None]) == 0 and led.released_entries == 0
    with pytest.warns(DeprecationWarning), led.observe_batch():
        pass
    with pytest.raises(AttributeError, match="no attribute 'nothing_like_it'"):
        led.nothing_like_it  # noqa: B018
