"""Ledger.totals() is kept incrementally (O(1) per scrape plus the entries that may have unused bytes): after
any sequence of operations it must equal a recomputation from a snapshot's records."""

import gc

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvguardian.ledger import EntrySite, EntryState, Ledger

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("begin"), st.integers(0, 3)),
        st.tuples(st.just("end"), st.integers(0, 3)),
        st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 64), st.one_of(st.none(), st.integers(1, 16))),
        st.tuples(st.just("touch"), st.integers(0, 40), st.integers(0, 3), st.integers(0, 20)),
        st.tuples(st.just("release"), st.integers(0, 40)),
        st.tuples(st.just("retain"), st.integers(0, 40)),
        st.tuples(st.just("clear"), st.integers(0, 40)),
        st.tuples(st.just("tensor"), st.integers(0, 3), st.integers(0, 2), st.integers(1, 8), st.booleans()),
        st.tuples(st.just("drop"), st.integers(0, 40)),
    ),
    min_size=10,
    max_size=80,
)


def recomputed(led):
    snap = led.snapshot()
    by_bytes = {s: 0 for s in ("live", "retained", "orphaned")}
    by_n = dict(by_bytes)
    unused = 0
    for r in snap.records:
        by_bytes[r.state.value] += r.storage_bytes
        by_n[r.state.value] += 1
        unused += r.unused_bytes
    total = sum(by_bytes.values())
    return by_bytes, by_n, (unused / total if total else 0.0)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_totals_match_a_recomputation(ops):
    led = Ledger()
    reqs = {i: led.begin_request(f"r{i}.0") for i in range(4)}  # slot -> its current request
    n_begun = 4
    keys = []
    tensors = []  # (slot, tensor): storages the test keeps alive, views of some
    for op in ops:
        kind = op[0]
        if kind == "begin" and not reqs[op[1]].active:  # a new request in this slot
            n_begun += 1
            reqs[op[1]] = led.begin_request(f"r{op[1]}.{n_begun}")
        elif kind == "end" and reqs[op[1]].active:
            led.end_request(reqs[op[1]].request_id)
        elif kind == "add":
            key = ("blk", len(keys))
            keys.append(key)
            cap = op[3]
            led.add_entry(key, kind="block", nbytes=op[2] * 16, request=reqs[op[1]], source="t",
                          filled_tokens=(op[2] % cap) if cap else None, capacity_tokens=cap)
        elif kind == "touch" and keys:
            key = keys[op[1] % len(keys)]
            try:
                led.touch_entry(key, reqs[op[2]], filled_tokens=op[3])
            except Exception:
                pass  # released already: a usage error, state unchanged
        elif kind == "release" and keys:
            try:
                led.release_entry(keys[op[1] % len(keys)])
            except Exception:
                pass
        elif kind == "retain" and keys:
            led.retain_keys([keys[op[1] % len(keys)]], "test")
        elif kind == "clear" and keys:
            led.clear_retention([keys[op[1] % len(keys)]])
        elif kind == "tensor":
            # a slot's new storage (a "cat"), or a smaller view of the current one (a crop)
            # slot 2 is observed without a slot (entries keyed by storage only)
            slot = ("s", op[2])
            current = next((t for s, t in tensors if s == slot), None)
            if op[4] and current is not None and current.shape[0] > 1:
                t = current[: current.shape[0] - 1]
            else:
                t = torch.zeros(op[3] + (op[3] % 3), 8)[: op[3]]  # a new storage, sometimes larger than the view
                tensors = [(s, x) for s, x in tensors if s != slot]  # the old storage dies (or is recycled)
            tensors.append((slot, t))
            led.observe_tensor(t, kind="k", layer=op[2], request=reqs[op[1]], source="t",
                               slot=slot if op[2] < 2 else None)
        elif kind == "drop" and tensors:
            tensors.pop(op[1] % len(tensors))
            gc.collect()
        led.check_invariants()
        t = led.totals()
        by_bytes, by_n, frag = recomputed(led)
        assert t.bytes_by_state == by_bytes
        assert t.entries_by_state == by_n
        assert abs(t.fragmentation_ratio - frag) < 1e-12


def test_totals_visit_only_entries_that_may_have_unused_bytes():
    led = Ledger()
    req = led.begin_request("r")
    for i in range(1000):
        led.add_entry(("b", i), kind="block", nbytes=256, request=req, source="t")
    led.add_entry(("b", "static"), kind="block", nbytes=256, request=req, source="t", filled_tokens=4,
                  capacity_tokens=16)
    assert led.partial_entries() == 1
    t = led.totals()
    assert t.entries_by_state["live"] == 1001
    assert t.fragmentation_ratio == 192 / (1001 * 256)
    led.end_request("r")
    t = led.totals()
    assert t.entries_by_state == {"live": 0, "retained": 0, "orphaned": 1001}
    assert t.residency_ratio == 1.0
    assert all(r.state is EntryState.ORPHANED for r in led.snapshot().records)


def test_unused_bytes_followed_on_every_observation_path():
    led = Ledger()
    req = led.begin_request("r")

    def check():
        led.check_invariants()
        t = led.totals()
        by_bytes, by_n, frag = recomputed(led)
        assert (t.bytes_by_state, t.entries_by_state) == (by_bytes, by_n)
        assert abs(t.fragmentation_ratio - frag) < 1e-12
        return frag

    # slotless: a full view first, then a crop of the same storage
    a = torch.zeros(8, 8)
    led.observe_tensor(a, kind="k", layer=0, request=req, source="t")
    assert check() == 0.0
    led.observe_tensor(a[:2], kind="k", layer=0, request=req, source="t")
    assert check() > 0
    # a slot: full, then a crop of the same storage (_continue)
    b = torch.zeros(8, 8)
    led.observe_tensor(b, kind="k", layer=1, request=req, source="t", slot="s1")
    led.observe_tensor(b[:4], kind="k", layer=1, request=req, source="t", slot="s1")
    check()
    # a slot whose storage died, continued by a new storage seen through a smaller view (_recycle)
    c = torch.zeros(8, 8)
    led.observe_tensor(c, kind="k", layer=2, request=req, source="t", slot="s2")
    del c
    gc.collect()
    d = torch.zeros(16, 8)
    led.observe_tensor(d[:9], kind="k", layer=2, request=req, source="t", slot="s2")
    check()
    # the same through _observe (recycling found by storage address rather than by the slot's fast path)
    e = torch.zeros(8, 8)
    led.observe_kv(e, None, (EntrySite("k", 3, "t", "s3"), EntrySite("v", 3, "t", "s3v")), req)
    del e
    gc.collect()
    f = torch.zeros(32, 8)
    led.observe_kv(f[:1], None, (EntrySite("k", 3, "t", "s3"), EntrySite("v", 3, "t", "s3v")), req)
    assert check() > 0
