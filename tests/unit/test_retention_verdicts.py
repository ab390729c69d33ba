"""Bounded or unbounded, decided from evidence (issue 12, part 4): real guards, KV tracked per request and
kept by the shapes under test; sampling on, as under `kv-guardian run`."""

import collections

import pytest
import torch

from kvg_testing import fake_module
from kvguardian.runtime.guard import Guard


@pytest.fixture
def app():
    with fake_module("retention_app") as mod:
        yield mod


def serve(guard, i, keep):
    with guard.request(f"r{i}"):
        k = torch.zeros(1, 1, 4 + i % 3, 4)
        guard.track(k, layer=0)
    keep(i, k)


def verdicts(guard):
    found = guard.check().by_id("KVG102")
    return {f.evidence["request_id"]: (f.severity.value, f.evidence["retention"]) for f in found}


def test_an_lru_that_evicts_is_bounded_even_with_entries_kept_all_run(app):
    guard = Guard(retention_sampling=True)
    app.LRU = collections.OrderedDict()

    def keep(i, k):
        key = "busy" if i % 2 else f"guest-{i}"
        app.LRU[key] = k
        app.LRU.move_to_end(key)
        while len(app.LRU) > 3:
            app.LRU.popitem(last=False)

    for i in range(40):
        serve(guard, i, keep)
    out = verdicts(guard)
    assert len(out) == 3 and {sev for sev, _ in out.values()} == {"info"}
    (why,) = {v["why"] for _, v in out.values()}
    assert why == "observed-eviction"
    ev = next(iter(out.values()))[1]["evidence"]
    assert ev["evictions_seen"] > 0 and ev["size"] == 3 and len(ev["sizes_over_time"]) >= 4


def test_a_collection_that_only_grows_is_an_error_with_its_sizes(app):
    guard = Guard(retention_sampling=True)
    app.HISTORY = []
    for i in range(20):
        serve(guard, i, lambda i, k: app.HISTORY.append(k))
    out = verdicts(guard)
    assert len(out) == 20 and {sev for sev, _ in out.values()} == {"error"}
    v = out["r0"][1]
    assert v["why"] == "unbounded-collection" and "only grew" in v["detail"]
    sizes = [s for _, s, _ in v["evidence"]["sizes_over_time"]]
    assert sizes == sorted(sizes) and sizes[-1] == 20 and sizes[0] < 20


def test_a_memo_that_stopped_growing_is_bounded(app):
    guard = Guard(retention_sampling=True)
    app.MEMO = {}
    for i in range(30):
        serve(guard, i, lambda i, k: app.MEMO.setdefault(i % 3, k))
    out = verdicts(guard)
    assert len(out) == 3 and {v["why"] for _, v in out.values()} == {"stopped-growing"}
    assert {sev for sev, _ in out.values()} == {"info"}


def test_bounded_deques_in_a_dict_that_grows_is_unbounded(app):
    guard = Guard(retention_sampling=True)
    app.BY_USER = {}
    for i in range(30):
        serve(guard, i, lambda i, k: app.BY_USER.setdefault(i // 3, collections.deque(maxlen=2)).append(k))
    out = verdicts(guard)
    assert {sev for sev, _ in out.values()} == {"error"}
    assert all("inside one that grows" in v["detail"] for _, v in out.values())


class Turn:
    def __init__(self, parent, kv):
        self.parent = parent
        self.kv = kv


def test_a_linked_history_is_one_growing_collection_not_single_references(app):
    guard = Guard(retention_sampling=True)
    app.LAST = None

    def keep(i, k):
        app.LAST = Turn(app.LAST, k)

    for i in range(20):
        serve(guard, i, keep)
    out = verdicts(guard)
    assert len(out) == 20 and {sev for sev, _ in out.values()} == {"error"}
    assert {v["collection"] for _, v in out.values()} == {"linked Turn.parent under module retention_app: LAST"}


def test_one_constant_cache_nobody_declared_stays_info(app):
    guard = Guard(retention_sampling=True)
    serve(guard, 0, lambda i, k: setattr(app, "PREFIX", k))
    for i in range(1, 12):
        serve(guard, i, lambda i, k: None)
    ((sev, v),) = verdicts(guard).values()
    assert sev == "info" and v["why"] == "single-reference"


def late_full_lru(app):
    """A guard that served 24 requests into an LRU of 17 slots with 24 distinct keys: it filled for 70% of
    the run, then evicted one entry per request."""
    guard = Guard(retention_sampling=True)
    app.LRU = collections.OrderedDict()

    def keep(i, k):
        app.LRU[i] = k
        if len(app.LRU) > 17:
            app.LRU.popitem(last=False)

    for i in range(24):
        serve(guard, i, keep)
    return guard


def test_an_lru_that_fills_for_most_of_the_run_then_evicts_is_bounded(app):
    # 17 slots, 24 distinct keys: no geometric sample saw it full before it began to evict
    guard = late_full_lru(app)
    out = verdicts(guard)
    assert len(out) == 17 and {sev for sev, _ in out.values()} == {"info"}
    v = next(iter(out.values()))[1]
    assert v["why"] == "observed-eviction" and v["evidence"]["evictions_seen"] > 0


def test_a_buffer_trimmed_in_bursts_is_bounded_and_one_trimmed_too_slowly_is_not(app):
    guard = Guard(retention_sampling=True)
    app.RECENT = []

    def trim_half(i, k):
        app.RECENT.append(k)
        if len(app.RECENT) > 6:
            del app.RECENT[:3]

    for i in range(24):
        serve(guard, i, trim_half)
    out = verdicts(guard)
    assert {sev for sev, _ in out.values()} == {"info"}
    assert {v["why"] for _, v in out.values()} == {"observed-eviction"}

    slow = Guard(retention_sampling=True)
    app.RECENT = []

    def trim_one_in_three(i, k):
        app.RECENT.append(k)
        if len(app.RECENT) > 6 and i % 3 == 0:
            del app.RECENT[0]

    for i in range(24):
        serve(slow, i, trim_one_in_three)
    out = verdicts(slow)
    assert len(out) > 12 and {sev for sev, _ in out.values()} == {"error"}
    assert {v["why"] for _, v in out.values()} == {"unbounded-collection"}


def growth(guard):
    return [(f.severity.value, f.message) for f in guard.check().by_id("KVG103")]


def test_retained_kv_that_grows_in_one_conversation_is_info_not_a_warning(app):
    # one live conversation: every turn's KV replaces the previous turn's, one token longer each time
    guard = Guard(retention_sampling=True)
    for i in range(24):
        with guard.request(f"r{i}"):
            k = torch.zeros(1, 1, 8 + 4 * i, 4)
            guard.track(k, layer=0)
        app.CONVERSATION = k
    ((sev, message),) = growth(guard)
    assert sev == "info" and "1 single-reference" in message


def test_retained_kv_that_grows_as_an_lru_fills_is_info_but_new_names_per_request_stay_a_warning(app):
    guard = late_full_lru(app)
    ((sev, message),) = growth(guard)
    assert sev == "info" and "17 observed-eviction" in message

    names = Guard(retention_sampling=True)
    for i in range(24):
        serve(names, i, lambda i, k: setattr(app, f"out_{i}", k))  # each request's KV under a name of its own
    ((sev, _),) = growth(names)
    assert sev == "warning"


def test_a_memo_that_took_most_of_the_run_to_fill_is_bounded(app):
    # ten canned prompts asked in a rotation that covers them all only after 15 of 24 requests
    guard = Guard(retention_sampling=True)
    app.MEMO = {}
    order = [0, 1, 0, 2, 1, 3, 0, 4, 5, 2, 6, 7, 1, 8, 9] + [i % 10 for i in range(9)]
    for i, key in enumerate(order):
        serve(guard, i, lambda i, k, key=key: app.MEMO.setdefault(key, k))
    out = verdicts(guard)
    assert len(out) == 10 and {sev for sev, _ in out.values()} == {"info"}
    assert {v["why"] for _, v in out.values()} == {"stopped-growing"}


def _hold_in_thread(k, go, ready):
    held = k  # the thread's frame keeps the request's KV while it waits
    ready.release()
    go.wait()
    return held


def test_a_thread_per_request_each_holding_its_kv_is_one_growing_collection():
    import threading

    guard = Guard(retention_sampling=True)
    go, ready, threads = threading.Event(), threading.Semaphore(0), []

    def keep(i, k):
        t = threading.Thread(target=_hold_in_thread, args=(k, go, ready), daemon=True)
        t.start()
        ready.acquire()
        threads.append(t)

    try:
        for i in range(16):
            serve(guard, i, keep)
        out = verdicts(guard)
    finally:
        go.set()
        for t in threads:
            t.join()
    assert len(out) == 16 and {sev for sev, _ in out.values()} == {"error"}
    v = out["r3"][1]
    assert v["why"] == "unbounded-collection" and v["collection"] == "threads running _hold_in_thread() " \
        "(test_retention_verdicts.py)", v
    sizes = [s for _, s, _ in v["evidence"]["sizes_over_time"]]
    assert sizes == sorted(sizes) and sizes[-1] == 16 and sizes[0] < 4


def _worker(jobs, guard, done):
    while True:
        i = jobs.get()
        if i is None:
            return
        with guard.request(f"r{i}"):
            k = torch.zeros(1, 1, 4 + i % 3, 4)
            guard.track(k, layer=0)
        last = k  # kept until the next job: at most one per worker  # noqa: F841
        done.release()


def test_a_fixed_pool_of_workers_each_keeping_its_last_kv_is_bounded():
    import queue
    import threading

    guard = Guard(retention_sampling=True)
    done = threading.Semaphore(0)
    queues = [queue.Queue(), queue.Queue()]
    workers = [threading.Thread(target=_worker, args=(q, guard, done), daemon=True) for q in queues]
    for t in workers:
        t.start()
    try:
        for i in range(24):
            queues[i % 2].put(i)  # each worker serves every other request and keeps its latest
            done.acquire()
        out = verdicts(guard)
    finally:
        for q in queues:
            q.put(None)
        for t in workers:
            t.join()
    assert len(out) == 2 and {sev for sev, _ in out.values()} == {"info"}, out
    (v,) = {v["why"] for _, v in out.values()}
    assert v == "stopped-growing"
