"""The ledger's timeline stays bounded however long the server runs, keeps peaks when it decimates, and keeps
each request's span (bounded too)."""

from __future__ import annotations

import pytest

from kvguardian._errors import UsageError
from kvguardian.ledger_timeline import Timeline
from kvguardian.report.history import read_history


def test_a_week_of_samples_stays_within_capacity_and_keeps_the_peak():
    tl = Timeline(0.0, capacity=256, interval_s=1.0)
    week = 7 * 86_400
    t = 0.0
    peak_at = 123_456.0
    while t < week:
        t += 1.0
        if t == peak_at:  # a request ends at the peak: sampled whatever the stride
            tl.sample(t, 10_000_000, 0, int(t), int(t) * 10, request_end=True)
        elif tl.due(t):
            tl.sample(t, 1000, 0, int(t), int(t) * 10)
    tl.check()
    assert len(tl.samples) < 256
    assert tl.stride >= 2048  # a sample now stands for ~40 minutes
    assert max(s[1] for s in tl.samples) == 10_000_000  # the one-second spike survived every merge
    assert tl.samples[-1][3] == pytest.approx(week, rel=0.01)
    assert [s[0] for s in tl.samples] == sorted(s[0] for s in tl.samples)


def test_request_ends_fold_into_the_last_sample_when_close():
    tl = Timeline(0.0, capacity=64, interval_s=1.0)
    for i in range(10):  # a short run: every request end is a sample
        tl.sample(i / 100, 100, 0, i, i, request_end=True)
    assert len(tl.samples) == 10
    for i in range(10_000):  # 10,000 request ends within 10 seconds
        tl.sample(1 + i / 1000, 100 + (500 if i == 7000 else 0), 0, i, i, request_end=True)
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
    from kvguardian.ledger_timeline import timeline_json

    tl = Timeline(100.0, capacity=32)
    tl.begin("r1", None, 100.0)
    tl.sample(101.0, 10, 0, 0, 0)
    assert not tl.due(101.5) and tl.due(102.0)
    tl.end("r1", 102.0, owned_bytes=10)
    tl.sample(102.0, 0, 0, 10, 0, request_end=True)
    hist = read_history(timeline_json(tl, 103.0, [], [], events_seen=0, events_dropped=0))
    assert [(s.t, s.live, s.orphaned) for s in hist.samples] == [(1.0, 10, 0), (2.0, 0, 10)]
    assert hist.requests[0].end == 2.0 and hist.now == 3.0
