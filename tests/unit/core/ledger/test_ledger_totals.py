"""Ledger.totals() is kept as entries and requests change, so a scrape does no pass over either: after any
sequence of operations every total - the unused bytes included - must equal a recomputation from a snapshot's
records, and the work `totals()` does must not grow with the number of entries or requests."""

import gc
import sys

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvguardian.core.ledger import EntrySite, EntryState, Ledger, Update

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("begin"), st.integers(0, 3)),
        st.tuples(st.just("end"), st.integers(0, 3)),
        st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 64), st.one_of(st.none(), st.integers(1, 16))),
        st.tuples(st.just("touch"), st.integers(0, 40), st.integers(0, 3), st.one_of(st.none(), st.integers(0, 20))),
        st.tuples(st.just("release"), st.integers(0, 40)),
        st.tuples(st.just("retain"), st.integers(0, 40)),
        st.tuples(st.just("clear"), st.integers(0, 40)),
        st.tuples(st.just("tensor"), st.integers(0, 3), st.integers(0, 2), st.integers(1, 8), st.booleans()),
        # a static cache layer: a preallocated storage of `cap` tokens written in place, `filled` of them used
        # (op[4]: a new storage for the slot, as a new cache or a reset does, else the same one)
        st.tuples(st.just("static"), st.integers(0, 3), st.integers(0, 1), st.integers(-1, 20), st.booleans()),
        st.tuples(st.just("fill"), st.integers(0, 1), st.integers(-1, 20)),  # a source read a static counter
        st.tuples(st.just("drop"), st.integers(0, 40)),
    ),
    min_size=10,
    max_size=80,
)


def reference_unused(r):
    """The definition, written out here independently of the ledger's code."""
    size = r.storage_bytes
    if r.filled_tokens is not None and r.capacity_tokens:
        return max(0, size - size * min(r.filled_tokens, r.capacity_tokens) // r.capacity_tokens)
    return max(0, size - r.logical_bytes)


def assert_totals_exact(led):
    led.check_invariants()
    t = led.totals()
    snap = led.snapshot()
    by_bytes = {s: 0 for s in ("live", "retained", "orphaned")}
    by_n = dict(by_bytes)
    for r in snap.records:
        by_bytes[r.state.value] += r.storage_bytes
        by_n[r.state.value] += 1
    unused = sum(reference_unused(r) for r in snap.records)
    total = sum(by_bytes.values())
    assert t.bytes_by_state == by_bytes
    assert t.entries_by_state == by_n
    assert t.unused_bytes == unused
    assert t.fragmentation_ratio == (unused / total if total else 0.0)
    assert t.residency_ratio == ((by_bytes["retained"] + by_bytes["orphaned"]) / total if total else 0.0)
    assert t.requests_active == sum(1 for r in snap.requests.values() if r.active)
    return t


class Driver:
    """Applies one generated operation to a ledger, keeping the tensors it observed alive until dropped."""

    def __init__(self, led):
        self.led = led
        self.reqs = {i: led.begin_request(f"r{i}.0") for i in range(4)}  # request slot -> its current request
        self.begun = 4
        self.keys = []
        self.tensors = []  # (slot, tensor): storages kept alive, views of some

    def key(self, i):
        return self.keys[i % len(self.keys)] if self.keys else None

    def apply(self, op):
        getattr(self, "op_" + op[0])(*op[1:])

    def op_begin(self, r):
        if not self.reqs[r].active:
            self.begun += 1
            self.reqs[r] = self.led.begin_request(f"r{r}.{self.begun}")

    def op_end(self, r):
        if self.reqs[r].active:
            self.led.end_request(self.reqs[r].request_id)

    def op_add(self, r, size, cap):
        key = ("blk", len(self.keys))
        self.keys.append(key)
        self.led.add_entry(key, kind="block", nbytes=size * 16, request=self.reqs[r], source="t",
                           filled_tokens=(size % cap) if cap else None, capacity_tokens=cap)

    def op_touch(self, i, r, filled):
        key = self.key(i)
        if key is not None and key in {r.key for r in self.led.records()}:  # a hit when another request touches it
            self.led.touch_entry(key, self.reqs[r], filled_tokens=filled)

    def op_release(self, i):
        key = self.key(i)
        if key is not None and key in {r.key for r in self.led.records()}:
            self.led.release_entry(key)

    def op_retain(self, i):
        if self.keys:
            self.led.retain_keys([self.key(i)], "test")

    def op_clear(self, i):
        if self.keys:
            self.led.clear_retention([self.key(i)])

    def _replace(self, slot, t):
        self.tensors = [(s, x) for s, x in self.tensors if s != slot]  # the old storage dies (or is recycled)
        self.tensors.append((slot, t))

    def op_tensor(self, r, layer, n, crop):
        # a slot's new storage (a "cat": the entry is recycled), or a smaller view of the current one (a crop);
        # layer 2 is observed without a slot (entries keyed by storage only)
        slot = ("s", layer)
        current = next((t for s, t in self.tensors if s == slot), None)
        if crop and current is not None and current.shape[0] > 1:
            t = current[: current.shape[0] - 1]
            self.tensors.append((slot, t))
        else:
            current = None  # the old storage dies here unless a kept view holds it: the entry is recycled
            t = torch.zeros(n + (n % 3), 8)[:n]  # a new storage, sometimes larger than the view
            self._replace(slot, t)
        site = EntrySite(kind="k", layer=layer, source="t", slot=slot if layer < 2 else None)
        self.led.observe(t, site, self.reqs[r])

    def op_static(self, r, layer, filled, new):
        slot = ("st", layer)
        current = next((t for s, t in self.tensors if s == slot), None)
        if new or current is None:
            current = torch.zeros(16, 4)  # 16 tokens of capacity
            self._replace(slot, current)
        site = EntrySite(kind="k", layer=layer, source="StaticLayer", slot=slot)
        self.led.observe(current, site, self.reqs[r], Update(filled if filled >= 0 else None, capacity_tokens=16))

    def op_fill(self, layer, filled):
        self.led.slots.fill([("st", layer)], max(filled, 0))

    def op_drop(self, i):
        if self.tensors:
            self.tensors.pop(i % len(self.tensors))
            gc.collect()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.integers(1, 6))
def test_totals_match_a_recomputation(ops, history):
    # The drops' full collections scan only what this example made: the worker's heap (every module and test
    # before this one) is frozen out of them (beside a million other objects: 45 s unfrozen, 4 s frozen).
    gc.freeze()
    try:
        # a short request history: ended requests are forgotten (pruned) while their entries come and go
        driver = Driver(Ledger(request_history=history))
        for op in ops:
            driver.apply(op)
            assert_totals_exact(driver.led)
    finally:
        gc.unfreeze()


def test_unused_bytes_of_partial_fills_static_caches_and_releases():
    led = Ledger()
    req = led.begin_request("r")
    for i in range(1000):
        led.add_entry(("b", i), kind="block", nbytes=256, request=req, source="t")
    led.add_entry(("b", "static"), kind="block", nbytes=256, request=req, source="t", filled_tokens=4,
                  capacity_tokens=16)
    t = assert_totals_exact(led)
    assert t.unused_bytes == 192 and t.fragmentation_ratio == 192 / (1001 * 256)
    led.touch_entry(("b", "static"), req, filled_tokens=12)
    assert assert_totals_exact(led).unused_bytes == 64
    led.touch_entry(("b", "static"), req, filled_tokens=40)  # past the capacity: full, never negative
    assert assert_totals_exact(led).unused_bytes == 0
    led.touch_entry(("b", "static"), req, filled_tokens=1)
    led.end_request("r")
    t = assert_totals_exact(led)
    assert t.entries_by_state == {"live": 0, "retained": 0, "orphaned": 1001}
    assert t.residency_ratio == 1.0 and t.requests_active == 0 and t.unused_bytes == 240
    assert all(r.state is EntryState.ORPHANED for r in led.snapshot().records)
    led.release_entry(("b", "static"))
    assert assert_totals_exact(led).unused_bytes == 0
    # a static layer: filled through the update, then through slots.fill (a source read the tensor counter)
    req = led.begin_request("r2")
    keys = torch.zeros(32, 8)
    site = EntrySite(kind="k", layer=0, source="StaticLayer", slot="st")
    led.observe(keys, site, req, Update(filled_tokens=8, capacity_tokens=32))
    assert assert_totals_exact(led).unused_bytes == 32 * 8 * 4 * 3 // 4
    led.observe(keys, site, req, Update(filled_tokens=16, capacity_tokens=32))
    assert assert_totals_exact(led).unused_bytes == 32 * 8 * 4 // 2
    led.slots.fill(["st"], 32)
    assert assert_totals_exact(led).unused_bytes == 0
    del keys
    gc.collect()
    assert assert_totals_exact(led).unused_bytes == 0 and len(led) == 1000


def test_unused_bytes_followed_on_every_observation_path():
    led = Ledger()
    req = led.begin_request("r")

    def check():
        return assert_totals_exact(led).fragmentation_ratio

    # slotless: a full view first, then a crop of the same storage
    a = torch.zeros(8, 8)
    led.observe(a, EntrySite(kind="k", layer=0, source="t"), req)
    assert check() == 0.0
    led.observe(a[:2], EntrySite(kind="k", layer=0, source="t"), req)
    assert check() > 0
    # a slot: full, then a crop of the same storage (_continue)
    b = torch.zeros(8, 8)
    led.observe(b, EntrySite(kind="k", layer=1, source="t", slot="s1"), req)
    led.observe(b[:4], EntrySite(kind="k", layer=1, source="t", slot="s1"), req)
    check()
    # a slot whose storage died, continued by a new storage seen through a smaller view (_recycle)
    c = torch.zeros(8, 8)
    led.observe(c, EntrySite(kind="k", layer=2, source="t", slot="s2"), req)
    del c
    gc.collect()
    d = torch.zeros(16, 8)
    led.observe(d[:9], EntrySite(kind="k", layer=2, source="t", slot="s2"), req)
    check()
    # and continued again by a full view: its unused bytes go back to none
    del d
    gc.collect()
    led.observe(torch.zeros(4, 8), EntrySite(kind="k", layer=2, source="t", slot="s2"), req)
    check()
    # the same through _observe (recycling found by storage address rather than by the slot's fast path)
    e = torch.zeros(8, 8)
    led.observe_kv(e, None, (EntrySite("k", 3, "t", "s3"), EntrySite("v", 3, "t", "s3v")), req)
    del e
    gc.collect()
    f = torch.zeros(32, 8)
    led.observe_kv(f[:1], None, (EntrySite("k", 3, "t", "s3"), EntrySite("v", 3, "t", "s3v")), req)
    assert check() > 0


def lines_run(fn):
    """Python lines executed by ``fn()``: a count that grows with any pass over entries or requests made in
    Python, deterministic where a timing is not."""
    count = [0]

    def tracer(frame, event, arg):
        if event == "line":
            count[0] += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count[0]


def populated(entries, requests):
    """A ledger like a busy server's: blocks a quarter partly filled, a static layer, ended and retained
    requests' entries. Its clock stands still, so the timeline's interval sample (a fixed cost a scrape may
    pay when one is due) falls in the first call for both sizes, not in whichever ran past the interval."""
    led = Ledger(clock=lambda: 1000.0)
    reqs = [led.begin_request(f"r{i}") for i in range(requests)]
    for i in range(entries):
        led.add_entry(("b", i), kind="block", nbytes=4096, request=reqs[i % requests], source="t",
                      filled_tokens=i % 16 if i % 4 == 0 else None, capacity_tokens=16 if i % 4 == 0 else None)
    for r in reqs[: requests // 2]:
        led.end_request(r.request_id)
    led.retain_keys([("b", i) for i in range(0, entries, 10)], "test")
    return led


def test_totals_work_does_not_grow_with_entries_or_requests():
    small, large = populated(8, 2), populated(5_000, 400)
    small.totals(), large.totals()  # settled: what is pending is applied once, not on every scrape
    assert small.totals().unused_bytes > 0 and large.totals().entries_by_state["orphaned"] > 0
    assert lines_run(large.totals) == lines_run(small.totals)
    # the counter does see a pass: a snapshot copies every entry
    assert lines_run(large.snapshot) > 100 * lines_run(small.snapshot) > 0
