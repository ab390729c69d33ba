"""The engine loop (`kvguardian.runtime.paged.loop`) that every server over the mini engine uses: futures and streamed
tokens equal to HF generate(), abort frees the blocks, the pre-OOM guard's preemption and shedding through the
loop, a failing step fails only what was in flight, a stopped loop answers at once."""

import contextlib
import threading
import time
from concurrent.futures import CancelledError

import pytest

from kvg_testing import paged_workload
from kvguardian.apps.repro.cross_request import one_thread
from kvguardian.runtime.paged import PagedKVPool
from kvguardian.runtime.paged.engine import Engine, OwnershipScheduler, Request
from kvguardian.runtime.paged.loop import EngineLoop, Stopped


@pytest.fixture(scope="module")
def work(tiny_model):
    return paged_workload(tiny_model, 6, seed=3, sys_tokens=(24, 40))


def _loop(work, num_blocks=128, *, eos=True, **kw):
    """A started loop; ``eos=False``: requests run to max_new_tokens (the tiny model soon says EOS)."""
    model, _, _, eos_id = work
    pool = PagedKVPool(num_blocks, 16, model.spec, debug=True, on_fault="raise")
    engine = Engine(model, OwnershipScheduler(pool), max_num_seqs=4, eos_token_id=eos_id if eos else None)
    return pool, engine, EngineLoop(engine, **kw).start()


@contextlib.contextmanager
def _running(work, num_blocks=128, *, eos=True, **kw):
    """`_loop`'s ``(pool, engine, loop)`` for the block; the loop is closed after it."""
    pool, engine, loop = _loop(work, num_blocks, eos=eos, **kw)
    try:
        yield pool, engine, loop
    finally:
        loop.close()


def _assert_every_block_back(loop, pool):
    with loop.lock:
        assert pool.metrics()["blocks_referenced"] == 0 and pool.check_invariants() == []


class Collect:
    def __init__(self):
        self.tokens, self.ends, self.done = [], [], threading.Event()

    def __call__(self, token, finished, stopped):
        if token is not None:
            self.tokens.append(token)
        if finished:
            self.ends.append(stopped)
            self.done.set()


def _wait(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_futures_and_streams_give_hf_tokens_and_every_block_comes_back(work):
    _, reqs, expected, _ = work
    with _running(work) as (pool, _, loop):
        with one_thread():
            streams = {r.request_id: Collect() for r in reqs[:3]}
            futs = {r.request_id: loop.submit(r, streams.get(r.request_id)) for r in reqs}
            seqs = {rid: f.result(timeout=60) for rid, f in futs.items()}
        assert {rid: s.output for rid, s in seqs.items()} == expected
        for rid, c in streams.items():
            assert c.done.wait(5) and c.tokens == expected[rid] and c.ends == [None]  # last token, finished
        _assert_every_block_back(loop, pool)
        assert loop.snapshot()["requests"] == len(reqs)


def test_abort_cancels_the_future_tells_the_callback_and_frees_the_blocks(work):
    _, reqs, _, _ = work
    with _running(work, eos=False) as (pool, engine, loop):
        long = Request("long", "acme", reqs[0].prompt, 10_000 // 16)
        c = Collect()
        fut = loop.submit(long, c)
        _wait(lambda: len(c.tokens) >= 2)
        loop.abort("long")
        assert c.done.wait(10) and c.ends == [Stopped("aborted", "aborted")]
        with pytest.raises(CancelledError):
            fut.result(timeout=5)
        _wait(lambda: loop.snapshot()["aborted"] == 1)
        with loop.lock:
            assert not engine.has_work and pool.metrics()["blocks_referenced"] == 0
            assert not pool.has_table("long") and pool.check_invariants() == []


def test_shed_and_preempt_asked_by_the_guard_are_carried_out_by_the_loop(work):
    _, reqs, _, _ = work
    with _running(work, eos=False) as (pool, engine, loop):
        with one_thread():
            first = Request("first", "acme", reqs[0].prompt, 200)
            newest = Request("newest", "acme", reqs[1].prompt, 200)
            c_first, c_newest = Collect(), Collect()
            f_first = loop.submit(first, c_first)
            _wait(lambda: len(c_first.tokens) >= 1)
            f_newest = loop.submit(newest, c_newest)
            _wait(lambda: len(c_newest.tokens) >= 1)
            assert engine.request_preempt(1) == 1  # from another thread, as the guard's sampling thread does
            _wait(lambda: engine.preemptions >= 1)
            assert engine.request_shed(1) == 1
            shed = f_newest.result(timeout=30)
            done = f_first.result(timeout=60)
        assert shed.error and "shed under memory pressure" in shed.error
        assert c_newest.ends[-1].reason == "shed" and loop.snapshot()["shed"] == 1
        assert done.error is None and c_first.ends == [None] and done.preemptions == 0
        _assert_every_block_back(loop, pool)


def test_a_failing_step_fails_what_is_in_flight_and_the_loop_serves_on(work):
    _, reqs, expected, _ = work
    with _running(work) as (pool, engine, loop):
        real = engine.model.forward
        calls = {"n": 0}

        def flaky(*a, **kw):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
            return real(*a, **kw)

        engine.model = type("M", (), {"forward": staticmethod(flaky)})()
        c = Collect()
        with pytest.raises(RuntimeError, match="the engine failed this request"):
            loop.submit(reqs[0], c).result(timeout=30)
        assert c.ends == [Stopped("failed", "the engine failed this request")]
        assert loop.stats.errors == ["RuntimeError: boom"]
        with one_thread():
            again = loop.submit(reqs[1]).result(timeout=60)
        assert again.output == expected[reqs[1].request_id]
        _assert_every_block_back(loop, pool)


def test_a_duplicate_request_id_fails_that_request_only(work):
    _, reqs, _, _ = work
    with _running(work, eos=False) as (_, _, loop), one_thread():
        a = loop.submit(Request("same", "acme", reqs[0].prompt, 50))
        _wait(lambda: loop.snapshot()["running"] == 1)
        b = loop.submit(Request("same", "acme", reqs[1].prompt, 4))
        with pytest.raises(RuntimeError, match="already in the engine"):
            b.result(timeout=30)
        assert len(a.result(timeout=60).output) == 50


def test_close_fails_in_flight_requests_and_a_closed_loop_answers_at_once(work):
    _, reqs, _, _ = work
    pool, _, loop = _loop(work, eos=False)
    c = Collect()
    fut = loop.submit(Request("long", "acme", reqs[0].prompt, 5000 // 16), c)
    _wait(lambda: len(c.tokens) >= 1)
    loop.close()
    with pytest.raises(RuntimeError, match="shutting down"):
        fut.result(timeout=5)
    assert c.ends == [Stopped("failed", "the server is shutting down")]
    assert pool.metrics()["blocks_referenced"] == 0
    late = Collect()
    with pytest.raises(RuntimeError, match="closed"):
        loop.submit(reqs[1], late).result(timeout=1)
    assert late.ends[0].reason == "failed"


def test_a_callback_that_raises_never_stops_the_engine(work):
    _, reqs, expected, _ = work
    with _running(work) as (_, _, loop):

        def bad(*_):
            raise ValueError("handler bug")

        with one_thread():
            seq = loop.submit(reqs[2], bad).result(timeout=60)
        assert seq.output == expected[reqs[2].request_id]
