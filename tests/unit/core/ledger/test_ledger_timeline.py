"""The ledger's timeline stays bounded however long the server runs, keeps peaks when it decimates, and keeps
each request's span (bounded too)."""

from __future__ import annotations

import pytest

from kvguardian.core.errors import UsageError
from kvguardian.core.ledger.timeline import Timeline
from kvguardian.core.report.history import read_history


def test_a_week_of_samples_stays_within_capacity_and_keeps_the_peak():
    tl = Timeline(0.0, capacity=256, interval_s=1.0)
    week = 7 * 86_400
    t = 0.0
    peak_at = 123_456.0
    while t < week:
        t += 1.0
        if t == peak_at:  # a request ends at the peak: sampled whatever the stride
            tl.sample(t, (10_000_000, 0, int(t), int(t) * 10), request_end=True)
        elif tl.due(t):
            tl.sample(t, (1000, 0, int(t), int(t) * 10))
    tl.check()
    assert len(tl.samples) < 256
    assert tl.stride >= 2048  # a sample now stands for ~40 minutes
    assert max(s[1] for s in tl.samples) == 10_000_000  # the one-second spike survived every merge
    assert tl.samples[-1][3] == pytest.approx(week, rel=0.01)
    assert [s[0] for s in tl.samples] == sorted(s[0] for s in tl.samples)


def test_request_ends_fold_into_the_last_sample_when_close():
    tl = Timeline(0.0, capacity=64, interval_s=1.0)
    for i in range(10):  # a short run: every request end is a sample
        tl.sample(i / 100, (100, 0, i, i), request_end=True)
    assert len(tl.samples) == 10
    for i in range(10_000):  # 10,000 request ends within 10 seconds
        tl.sample(1 + i / 1000, (100 + (500 if i == 7000 else 0), 0, i, i), request_end=True)
    assert len(tl.samples) < 64 and tl.stride > 1
    assert max(s[1] for s in tl.samples) == 600  # the peak request end is kept
    assert tl.samples[-1][4] == 9999  # released so far: the latest


def test_lanes_are_bounded_and_record_when_kv_was_freed():
    tl = Timeline(10.0, lanes=100)
    for i in range(1000):
        tl.begin(f"r{i}", "t", 10.0 + i)
        tl.end(f"r{i}", 10.5 + i, owned_bytes=64 if i % 2 else 0)
    tl.freed("r999", 2000.0)
    assert len(tl.lanes) == 100 and tl.lanes_dropped == 900 and tl.requests_seen == 1000
    lane = tl.lanes["r999"]
    assert (lane.start, lane.end, lane.bytes, lane.freed) == (999.0, 999.5, 64, 1990.0)
    assert tl.lanes["r998"].freed == tl.lanes["r998"].end  # owned nothing at its end
    tl.freed("unknown", 1.0)  # a request no longer listed is ignored


def test_bad_settings_are_refused():
    with pytest.raises(UsageError, match="out of range"):
        Timeline(0.0, capacity=2)


def test_json_follows_the_history_schema():
    from kvguardian.core.ledger.timeline import timeline_json

    tl = Timeline(100.0, capacity=32)
    tl.begin("r1", None, 100.0)
    tl.sample(101.0, (10, 0, 0, 0))
    assert not tl.due(101.5) and tl.due(102.0)
    tl.end("r1", 102.0, owned_bytes=10)
    tl.sample(102.0, (0, 0, 10, 0), request_end=True)
    hist = read_history(timeline_json(tl, 103.0, [], [], events_dropped=0))
    assert [(s.t, s.live, s.orphaned) for s in hist.samples] == [(1.0, 10, 0), (2.0, 0, 10)]
    assert hist.requests[0].end == 2.0 and hist.now == 3.0


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _ledger(clock, **kw):
    from kvguardian.core.ledger import Ledger

    return Ledger(clock=clock, **kw)


def test_the_ledger_samples_request_ends_and_lanes_know_when_kv_was_freed():
    clock = _Clock()
    led = _ledger(clock)
    for i in range(3):
        req = led.begin_request(f"r{i}", tenant="acme")
        led.add_entry(("blk", i), nbytes=100, request=req, kind="block", source="test", layer=i)
        clock.t += 0.1
        led.end_request(f"r{i}")
        clock.t += 0.1
        if i != 1:
            led.release_entry(("blk", i))  # r1 keeps its KV
    clock.t += 5
    hist = read_history(led.timeline(led.snapshot()))
    by_id = {r.id: r for r in hist.requests}
    assert [(r.start, r.end) for r in hist.requests] == [(0.0, pytest.approx(0.1)), (pytest.approx(0.2), 0.3),
                                                         (pytest.approx(0.4), pytest.approx(0.5))]
    assert by_id["r0"].released == pytest.approx(0.2) and by_id["r0"].state == "released"
    assert by_id["r1"].released is None and by_id["r1"].state == "orphaned"
    assert by_id["r1"].after_end == {1: 100} and by_id["r1"].bytes == 100
    peaks = [s.live for s in hist.samples]
    assert max(peaks) == 100  # each request's KV at its end, before it became orphaned
    assert hist.samples[-1].orphaned == 100 and hist.samples[-1].released == 200
    assert hist.entries[0].request == "r1" and hist.entries[0].state == "orphaned"
    assert [e.kind for e in hist.events].count("release") == 2


def test_a_week_long_ledger_stays_bounded():
    clock = _Clock()
    led = _ledger(clock, timeline_capacity=128, timeline_lanes=64)
    for i in range(20_000):  # a request every 30 s for a week
        req = led.begin_request(f"r{i}")
        led.add_entry(i, nbytes=64, request=req, kind="block", source="test")
        clock.t += 1.0
        led.end_request(f"r{i}")
        led.release_entry(i)
        clock.t += 29.0
        led.begin_batch()  # a forward: the interval sample, when due
        led.end_batch()
    tl = led.timeline(led.snapshot())
    assert len(tl["samples"]) < 128 and len(tl["requests"]) == 64
    assert tl["requests_seen"] == 20_000 and tl["requests_dropped"] == 20_000 - 64
    assert tl["samples"][-1][0] == pytest.approx(20_000 * 30, rel=0.01)
    led._timeline.check()


def test_kvg103_carries_its_trend_line_for_the_timeline():
    from kvguardian.core.detectors.growth import theil_sen, trend_line

    window = [(1000.0 + i, f"r{i}", 100 * i + (7 if i % 3 else 0)) for i in range(32)]
    slope = theil_sen([b for _, _, b in window])
    (t0, b0), (t1, b1) = trend_line(window, slope)
    assert (t0, t1) == (1000.0, 1031.0)
    assert b0 == pytest.approx(0, abs=8) and b1 == pytest.approx(3100, abs=8)
    assert trend_line([], 1.0) == []


def test_interval_samples_come_from_scrapes_and_pool_frees_while_no_request_ends():
    clock = _Clock()
    led = _ledger(clock, timeline_interval=10.0)
    req = led.begin_request("long", tenant=None)
    for i in range(6):  # a pool frees blocks of a request that never ends
        led.add_entry(("blk", i), nbytes=10, request=req, kind="block", source="test")
    for i in range(6):
        clock.t += 10.0
        led.release_entry(("blk", i))
    frees = [(s[0], s[1]) for s in led.timeline(led.snapshot())["samples"]]
    assert [t for t, _ in frees] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert [b for _, b in frees][1:] == [50, 40, 30, 20, 10, 0]
    n = len(frees)
    for _ in range(60):  # idle for ten minutes, scraped every 10 s
        clock.t += 10.0
        led.totals()
    samples = led.timeline(led.snapshot())["samples"]
    assert len(samples) == n + 60 and samples[-1][0] == 660.0  # one per scrape; the report's own is the same
    clock.t += 3.0
    led.totals()  # not due
    assert [s[0] for s in led.timeline(led.snapshot())["samples"][-2:]] == [660.0, 663.0]  # the report's sample
