"""Records and requests: write-once fields are really write-once; what changes when an entry continues with a
new storage is exactly what the Record documents (key, storage bytes, weak reference, incarnation)."""

import pytest
import torch

from kvguardian.ledger import EntryOrigin, EntrySite, EntryState, Ledger, Record, RequestInfo

SITES = (EntrySite("k", 0, "DynamicLayer", ("c", 0, "k")), EntrySite("v", 0, "DynamicLayer", ("c", 0, "v")))


def test_origin_fields_are_read_only():
    led = Ledger()
    t = torch.zeros(1, 2, 3, 4)
    rec = led.observe(t, SITES[0], None)
    assert (rec.entry_id, rec.kind, rec.layer, rec.source, rec.slot) == (1, "k", 0, "DynamicLayer", ("c", 0, "k"))
    assert (rec.dtype, rec.device, rec.generation, rec.capacity_tokens) == ("torch.float32", "cpu", 0, None)
    for name, value in (("entry_id", 9), ("kind", "v"), ("layer", 3), ("source", "x"), ("dtype", "f"),
                        ("generation", 2), ("cache", "c"), ("capacity_tokens", 8)):
        with pytest.raises(AttributeError):
            setattr(rec, name, value)
    assert isinstance(rec.origin, tuple)  # immutable: its fields cannot be assigned either
    with pytest.raises(AttributeError):
        rec.origin.entry_id = 9  # type: ignore[misc]


def test_continuing_with_a_new_storage_keeps_the_origin():
    led = Ledger()
    req = led.begin_request("r")
    k = torch.zeros(1, 2, 1, 4)
    led.observe_kv(k, None, SITES, req)
    [before] = led.records()
    for _ in range(3):
        k = torch.cat([k, torch.zeros(1, 2, 1, 4)], dim=2)  # the old storage is freed: the entry continues
        led.observe_kv(k, None, SITES, req)
    [after] = led.records()
    assert after.origin is before.origin
    assert after.incarnation == 3 and after.key != before.key and after.storage_bytes == 4 * before.storage_bytes


def test_copy_shares_the_origin_and_holds_no_weak_reference():
    led = Ledger()
    t = torch.zeros(8)
    led.observe(t, SITES[0], None)
    [copy] = led.snapshot().records
    assert copy.wref is None and copy.state is EntryState.LIVE and type(copy.shape) is tuple
    assert copy.copy().origin is copy.origin


def test_records_are_built_by_keyword():
    origin = EntryOrigin(entry_id=1, site=SITES[0], generation=0, dtype="", device="", created=0.0,
                         capacity_tokens=16)
    with pytest.raises(TypeError):
        Record(origin, 1, None, None, (), 0, 0, 0.0)  # type: ignore[misc]
    rec = Record(origin=origin, key=1, request_id=None, tenant=None, shape=(), logical_bytes=64, storage_bytes=64,
                 last_access=0.0, filled_tokens=4)
    assert rec.unused_bytes == 48  # 4 of 16 tokens hold data


def test_request_write_once_fields():
    info = RequestInfo(request_id="a", tenant="t", generation=0, started=1.0)
    for name, value in (("request_id", "b"), ("tenant", "u"), ("generation", 1), ("started", 2.0),
                        ("implicit", True)):
        with pytest.raises(AttributeError, match=rf"RequestInfo\.{name} .* is write-once"):
            setattr(info, name, value)
    info.ended = 2.0  # from None: once
    with pytest.raises(AttributeError, match=r"RequestInfo\.ended .* is write-once"):
        info.ended = 3.0
    info.entry_ids.add(7)  # the ledger's to change
    assert not info.active and info.copy().entry_ids == {7}
