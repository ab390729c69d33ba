"""The hot path's slot recycling keeps the ledger's guarantees: a freed slot storage is replaced in the same
entry (same counters as release + new record), a storage that is still alive keeps an entry of its own."""

import torch

from kvguardian.ledger import EntrySite, Ledger

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
    assert led.released_entries == 3 and led.released_bytes == (1 + 2 + 3) * 2 * 4 * 4
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
