"""The hot path's slot recycling keeps the ledger's guarantees: a freed slot storage is replaced in the same
entry (same counters as release + new record), a storage that is still alive keeps an entry of its own."""

import torch

from kvguardian.core.ledger import EntrySite, Ledger

SITES = (EntrySite("k", 0, "DynamicLayer", ("c", 0, "k")), EntrySite("v", 0, "DynamicLayer", ("c", 0, "v")))


def test_recycled_slot_counts_like_release_plus_new():
    led = Ledger()
    req = led.begin_request("r")
    k = torch.zeros(1, 2, 1, 4)
    led.observe_kv(k, None, SITES, req)
    for _ in range(3):
        k = torch.cat([k, torch.zeros(1, 2, 1, 4)], dim=2)  # the old storage is freed here
        led.observe_kv(k, None, SITES, req)
    snap = led.snapshot()
    assert len(snap.records) == 1 and snap.records[0].storage_bytes == 4 * 2 * 4 * 4
    assert snap.records[0].incarnation == 3
    assert led.totals().released_entries == 3 and led.totals().released_bytes == (1 + 2 + 3) * 2 * 4 * 4
    led.check_invariants()
    del k
    assert len(led) == 0 and led.snapshot().event_counts["release"] == 1


def test_superseded_storage_still_alive_keeps_its_own_entry():
    led = Ledger()
    req = led.begin_request("r")
    old = torch.zeros(1, 2, 3, 4)
    led.observe_kv(old, None, SITES, req)
    new = torch.cat([old, old], dim=2)  # `old` is kept alive (e.g. by an autograd graph or a leak)
    led.observe_kv(new, None, SITES, req)
    recs = sorted(led.snapshot().records, key=lambda r: r.entry_id)
    assert len(recs) == 2 and recs[0].superseded and not recs[1].superseded
    led.end_request("r")
    assert led.snapshot().bytes_by_state()["orphaned"] == (3 + 6) * 2 * 4 * 4
    del old
    assert len(led) == 1
    led.check_invariants()


def _observed_twice(touch: bool):
    """A static layer's two steps: observe its keys and values, then the next step by ``touch_kv`` (same tensor
    objects) or by ``observe_kv`` again. Returns the ledger, its record of keys and touch_kv's answer."""
    from kvguardian.core.ledger import Update

    led = Ledger()
    req = led.begin_request("r")
    k, v = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4)
    led.observe_kv(k, v, SITES, req, Update(3, 8, False))
    answer = led.slots.touch(SITES, req, Update(4, 8, False)) if touch else led.observe_kv(
        k, v, SITES, req, Update(4, 8, False))
    return led, k, v, answer


def test_touch_kv_records_what_observe_kv_records_for_the_same_tensors():
    """touch_kv (the tensors not read again) leaves the ledger as observe_kv of the same tensors does: the fill,
    the unused bytes, the append counts, the entries, their invariants."""
    touched, *_keep1 = _observed_twice(True)
    observed, *_keep2 = _observed_twice(False)
    assert _keep1[2] is True

    def state(led):
        snap = led.snapshot()
        recs = [(r.kind, r.filled_tokens, r.storage_bytes, r.logical_bytes, r.unused_bytes, r.incarnation)
                for r in sorted(snap.records, key=lambda r: r.kind)]
        return recs, led.totals().unused_bytes, snap.event_counts

    assert state(touched) == state(observed)
    assert state(touched)[0][0][1] == 4  # the new fill
    touched.check_invariants()


def test_touch_kv_changes_nothing_when_a_storage_is_gone():
    """A slot whose storage was freed (or never observed): False, nothing recorded - the source observes the
    tensors instead."""
    led, k, _v, _ = _observed_twice(True)
    before = led.snapshot().event_counts
    del k  # the keys' storage is freed
    from kvguardian.core.ledger import Update

    assert led.slots.touch(SITES, led.request("r"), Update(5, 8, False)) is False
    assert [r.filled_tokens for r in led.snapshot().records] == [4]  # the values' entry untouched too
    assert led.snapshot().event_counts["append"] == before["append"]
    other = (EntrySite("k", 1, "StaticLayer", ("c", 1, "k")), EntrySite("v", 1, "StaticLayer", ("c", 1, "v")))
    assert led.slots.touch(other, led.request("r")) is False
    led.check_invariants()
