from kvguardian.core.ledger import EntryState, Ledger
from kvguardian.runtime.guard import Guard
from kvguardian.runtime.paged import PagedKVPool
from kvguardian.runtime.paged.ledger_feed import LedgerFeed


def test_cached_blocks_become_declared_retained_entries_and_hits_move_ownership():
    led = Ledger()
    feed = LedgerFeed(led)
    p = PagedKVPool(8, 4)
    led.begin_request("a", "acme")
    p.open("a", "acme")
    p.append("a", list(range(9)))  # 2 full blocks stored
    assert feed.pump(p) == 1
    led.end_request("a")
    p.free("a")
    snap = led.snapshot()
    assert [(r.kind, r.request_id, r.state) for r in snap.records] == [("block", "a", EntryState.RETAINED)] * 2
    assert all(r.retained_reason == "prefix cache (bounded by the pool)" for r in snap.records)
    led.begin_request("b", "acme")
    p.open("b", "acme")
    assert p.match_prefix("b", list(range(9))) == 8
    feed.pump(p)
    snap = led.snapshot()
    assert {r.request_id for r in snap.records} == {"b"} and snap.event_counts["hit"] == 2
    led.end_request("b")
    p.free("b")
    p.open("c", "globex")
    p.append("c", list(range(100, 132)))  # takes all 8 blocks: the 2 cached ones are evicted
    feed.pump(p)
    snap = led.snapshot()
    assert snap.released_entries == 2 and snap.event_counts["release"] == 2
    assert len(snap.records) == 8 and feed.gaps == 0
    p.reset_prefix_cache()
    feed.pump(p)
    assert len(led) == 0


def test_removal_of_unknown_hashes_is_ignored_and_gaps_are_counted():
    led = Ledger()
    feed = LedgerFeed(led)
    p = PagedKVPool(64, 1, event_capacity=3)
    p.open("a", "t")
    for t in range(10):  # ten "stored" events, the first seven dropped by the bounded buffer
        p.append("a", [t])
    feed.pump(p)
    assert feed.gaps == 7 and len(led) == 3
    p.free("a")
    p.evict_cached()  # removals of hashes the feed never saw
    feed.pump(p)
    assert len(led) == 0 and feed.gaps == 7


def test_guard_report_stays_clean_for_a_declared_prefix_cache():
    guard = Guard()
    feed = LedgerFeed(guard.ledger)
    p = PagedKVPool(16, 4)
    for i in range(3):
        with guard.request(f"r{i}", tenant="acme"):
            p.open(f"r{i}", "acme")
            hit = p.match_prefix(f"r{i}", [1, 2, 3, 4, 5, 6, 7, 8, 9 + i])
            p.append(f"r{i}", [1, 2, 3, 4, 5, 6, 7, 8, 9 + i][hit:])
            feed.pump(p)
        p.free(f"r{i}")
    report = guard.check(holder_chains=False)
    assert report.by_id("KVG102") == []
    assert guard.snapshot().summary()["bytes"]["retained"] == 0  # a bookkeeping pool: zero bytes per block
    assert {r.state for r in guard.snapshot().records} == {EntryState.RETAINED}
