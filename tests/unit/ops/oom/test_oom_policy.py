"""Watermarks: order checks, hysteresis, fail-open on an unknown pressure."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvguardian.core.errors import UsageError
from kvguardian.ops.oom.policy import PolicyState, Watermarks, decide


@pytest.mark.parametrize(("kw", "message"), [
    ({"evict": 0.97, "drain": 0.92}, "out of order"),
    ({"drain": 0.99, "shed": 0.99}, "out of order"),
    ({"shed": 1.5}, "out of order"),
    ({"evict": 0.0}, "out of order"),
    ({"hysteresis": -0.1}, "hysteresis"),
    ({"hysteresis": 0.95}, "hysteresis"),
    ({"evict": float("nan")}, "not a number"),
])
def test_bad_watermarks_are_one_line_with_the_fix(kw, message):
    with pytest.raises(UsageError, match=message) as err:
        Watermarks(**kw)
    assert "fix:" in str(err.value)


WM = Watermarks()


def run(seq, wm=WM):
    state, out = PolicyState(), []
    for p in seq:
        state = decide(state, p, wm)
        out.append(state)
    return out


def test_evict_then_drain_then_release_with_hysteresis():
    s = run([0.5, 0.93, 0.91, 0.95, 0.975, 0.96, 0.945, 0.93, 0.88])
    assert [x.evicting for x in s] == [False, True, True, True, True, True, True, True, False]
    assert [x.act_evict for x in s] == [False, True, False, True, True, True, True, True, False]
    assert [x.draining for x in s] == [False, False, False, False, True, True, True, False, False]


def test_shed_only_while_draining():
    s = run([0.995, 0.97, 0.995])
    assert [x.act_shed for x in s] == [True, False, True]
    assert not run([0.98, 0.94, 0.93])[-1].act_shed


def test_unknown_pressure_keeps_latches_and_does_nothing():
    s = run([0.98, None])
    assert s[1].draining and s[1].evicting and not s[1].act_evict and not s[1].act_shed
    assert not run([None])[0].draining


@given(st.lists(st.floats(0, 1.2), min_size=1, max_size=60))
def test_latches_hold_their_invariants(seq):
    wm = Watermarks()
    prev = PolicyState()
    for p in seq:
        s = decide(prev, p, wm)
        assert s.draining == (p >= wm.drain or (prev.draining and p >= wm.drain - wm.hysteresis))
        assert not s.draining or s.evicting  # draining implies evicting (drain - h >= evict - h)
        assert s.act_evict == (p >= wm.evict)
        prev = s
