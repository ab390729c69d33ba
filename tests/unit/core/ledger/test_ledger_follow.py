"""`Ledger.follow`: a followed entry's storage dying is its slot moving on, not a release - until the source
observes the slot again (the entry continues), stops following it (released then, if nothing replaced it), or
the slot's owner died (released at that time). What the decode-step sampler of `hf.sampling` relies on."""

import torch

from kvguardian.core.ledger import EntrySite, EntryState, Ledger

SLOT = ("cache", 0, "k")


def observe(led, t, req, slot=SLOT):
    return led.observe(t, EntrySite(kind="k", layer=0, source="DynamicLayer", slot=slot), req)


def followed(rows=4):
    """A ledger, its request, a tensor observed in SLOT and the entry, SLOT followed."""
    led = Ledger()
    req = led.begin_request("r1")
    t = torch.zeros(rows, 64)
    rec = observe(led, t, req)
    led.slots.follow([SLOT])
    return led, req, t, rec


def releases(led):
    return [e for e in led.events() if e.kind == "release"]


def test_a_followed_entry_outlives_its_storage_and_continues_with_the_next():
    led, req, t, rec = followed()
    del t  # the next step's torch.cat replaced it: nothing observed it
    led.check_invariants()  # settles: the death is applied (postponed)
    assert len(led) == 1 and led.totals().bytes_by_state["live"] == 4 * 64 * 4
    assert releases(led) == []
    t2 = torch.zeros(6, 64)  # the slot's storage when the source looks again
    again = observe(led, t2, req)
    assert again is rec and rec.storage_bytes == 6 * 64 * 4 and rec.key == t2.untyped_storage().data_ptr()
    led.slots.follow([SLOT], on=False)
    led.check_invariants()
    del t2  # not followed any more: its death is a release
    assert len(led) == 0 and len(releases(led)) == 1


def test_stopping_releases_a_followed_entry_whose_storage_is_gone_at_the_owners_death():
    led, _, t, _ = followed()
    del t
    died = led.clock() + 5.0
    led.slots.follow([SLOT], on=False, at=died)
    assert len(led) == 0
    [rel] = releases(led)
    assert rel.ts == died


def test_stopping_keeps_a_followed_entry_whose_storage_is_alive():
    led, _, t, _ = followed()
    led.slots.follow([SLOT], on=False, at=led.clock())  # the cache died, but something else holds the storage
    assert len(led) == 1 and releases(led) == []
    del t
    assert len(led) == 0 and len(releases(led)) == 1


def test_a_followed_entrys_old_address_is_free_for_another_storage():
    led, req, t, ours = followed()
    addr = t.untyped_storage().data_ptr()
    del t
    led.check_invariants()
    others = []
    for _ in range(64):  # the allocator hands the address out again, sooner or later
        o = torch.zeros(4, 64)
        others.append(o)
        if o.untyped_storage().data_ptr() == addr:
            break
    other = observe(led, others[-1], req, slot=("cache", 1, "k"))
    assert other is not ours and ours.state is EntryState.LIVE and ours.storage_bytes == 4 * 64 * 4
    led.check_invariants()


def test_a_superseded_storage_is_released_when_it_dies_and_the_new_entry_follows():
    led, req, old, first = followed()
    new = torch.zeros(5, 64)
    second = observe(led, new, req)  # the old storage is still alive (kept elsewhere): a new entry
    assert second is not first and first.superseded and second.follows and not first.follows
    del old
    assert len(led) == 1 and len(releases(led)) == 0  # a superseded entry leaves silently
    assert led.totals().released_entries == 1
    del new  # followed: postponed, not released
    led.check_invariants()
    assert len(led) == 1
