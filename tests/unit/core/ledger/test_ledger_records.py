"""Records and requests: write-once fields are really write-once; what changes when an entry continues with a
new storage is exactly what the Record documents (key, storage bytes, weak reference, incarnation)."""

import dataclasses

import pytest
import torch

from kvguardian.core.errors import UsageError
from kvguardian.core.ledger import EntrySite, EntryState, Ledger, Record, RequestInfo

SITES = (EntrySite("k", 0, "DynamicLayer", ("c", 0, "k")), EntrySite("v", 0, "DynamicLayer", ("c", 0, "v")))
WRITE_ONCE = {"entry_id", "kind", "layer", "generation", "source", "dtype", "device", "created", "slot",
              "capacity_tokens", "role", "cache"}


def test_the_write_once_fields_are_final():
    """``Final``: mypy (test_quality runs it over src/) refuses any assignment to them after the constructor."""
    hints = {f.name: str(f.type) for f in dataclasses.fields(Record)}
    assert {name for name, hint in hints.items() if hint.startswith("Final[")} == WRITE_ONCE


def test_continuing_with_a_new_storage_changes_only_what_is_documented():
    led = Ledger()
    req = led.begin_request("r")
    k = torch.zeros(1, 2, 1, 4)
    led.observe_kv(k, None, SITES, req)
    [before] = led.records()
    for _ in range(3):
        k = torch.cat([k, torch.zeros(1, 2, 1, 4)], dim=2)  # the old storage is freed: the entry continues
        led.observe_kv(k, None, SITES, req)
    [after] = led.records()
    assert {name: getattr(after, name) for name in WRITE_ONCE} == {name: getattr(before, name) for name in WRITE_ONCE}
    assert after.incarnation == 3 and after.key != before.key and after.storage_bytes == 4 * before.storage_bytes


def test_copy_holds_no_weak_reference():
    led = Ledger()
    t = torch.zeros(8)
    led.observe(t, SITES[0], None)
    [copy] = led.snapshot().records
    assert copy.wref is None and copy.state is EntryState.LIVE and type(copy.shape) is tuple
    again = copy.copy()
    assert all(getattr(again, f.name) == getattr(copy, f.name) for f in dataclasses.fields(Record))


def test_unused_bytes_of_a_static_entry():
    rec = Record(entry_id=1, key=1, kind="block", layer=None, request_id=None, tenant=None, generation=0, source="t",
                 shape=(), dtype="", device="", logical_bytes=64, storage_bytes=64, created=0.0, last_access=0.0,
                 filled_tokens=4, capacity_tokens=16)
    assert rec.unused_bytes == 48  # 4 of 16 tokens hold data


def test_request_write_once_fields():
    hints = {f.name: str(f.type) for f in dataclasses.fields(RequestInfo)}
    assert {name for name, hint in hints.items() if hint.startswith("Final[")} == {
        "request_id", "tenant", "generation", "started", "implicit", "site"}
    led = Ledger()
    info = led.begin_request("a", tenant="t")
    led.end_request("a")  # sets ended, once: a second end is refused
    with pytest.raises(UsageError, match="request 'a' is not active"):
        led.end_request("a")
    assert not info.active and info.copy().ended == info.ended
