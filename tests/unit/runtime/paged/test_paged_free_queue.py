import random
from collections import OrderedDict

import numpy as np
import pytest

from kvguardian.core.errors import InternalError, UsageError
from kvguardian.runtime.paged import free_queue
from kvguardian.runtime.paged.free_queue import FreeQueue


def ids(*xs):
    return np.asarray(xs, dtype=np.int32)


def test_starts_full_in_id_order_and_pops_front():
    q = FreeQueue(5)
    assert len(q) == 5
    assert q.pop_front(2) == [0, 1]
    assert q.live_ids().tolist() == [2, 3, 4]


def test_push_front_is_popped_first_and_push_back_last():
    q = FreeQueue(6)
    q.pop_front(6)
    q.push_back(ids(4, 5))
    q.push_front(ids(0, 1))  # 0 first
    q.push_back(ids(2))
    assert q.live_ids().tolist() == [0, 1, 4, 5, 2]
    assert q.pop_front(5) == [0, 1, 4, 5, 2]


def test_remove_from_the_middle_is_skipped_by_pop():
    q = FreeQueue(6)
    q.remove(ids(1, 3))
    assert len(q) == 4
    assert q.contains(ids(0, 1, 3, 5)).tolist() == [True, False, False, True]
    assert q.pop_front(3) == [0, 2, 4]


def test_pop_more_than_live_is_an_internal_error():
    q = FreeQueue(3)
    q.remove(ids(0))
    with pytest.raises(InternalError, match="pop of 3 blocks with 2 live"):
        q.pop_front(3)


def test_needs_a_block():
    with pytest.raises(UsageError, match="at least 1 block"):
        FreeQueue(0)


@pytest.mark.parametrize("n", [64, 3000])  # 3000: enough back-pushes to compact the back part many times
def test_random_operations_match_a_reference_lru_including_wrap_and_compaction(n):
    q = FreeQueue(n)
    ref: OrderedDict[int, None] = OrderedDict((i, None) for i in range(n))
    held: set[int] = set()
    rnd = random.Random(7)
    for _ in range(4000 if n < 1000 else 20000):
        op = rnd.random()
        if op < 0.35 and ref:
            k = rnd.randint(1, min(8, len(ref)))
            got = q.pop_front(k)
            want = [ref.popitem(last=False)[0] for _ in range(k)]
            assert got == want
            held.update(got)
        elif op < 0.6 and held:
            batch = rnd.sample(sorted(held), rnd.randint(1, min(6, len(held))))
            held.difference_update(batch)
            q.push_front(np.asarray(batch, dtype=np.int32))
            for b in reversed(batch):
                ref[b] = None
                ref.move_to_end(b, last=False)
        elif op < 0.85 and held:
            batch = rnd.sample(sorted(held), rnd.randint(1, min(6, len(held))))
            held.difference_update(batch)
            q.push_back(np.asarray(batch, dtype=np.int32))
            for b in batch:
                ref[b] = None
        elif ref:
            batch = rnd.sample(list(ref), rnd.randint(1, min(4, len(ref))))
            q.remove(np.asarray(batch, dtype=np.int32))
            for b in batch:
                del ref[b]
            held.update(batch)
        assert len(q) == len(ref)
    assert q.live_ids().tolist() == list(ref)


def test_an_aged_queue_stays_compact_and_in_order():
    """Cached blocks pushed at the back and hit from the middle, for 20 x the queue's size: the back part's
    garbage (popped entries and tombstones) is bounded and the order is still the LRU order."""
    n = 2048
    q = FreeQueue(n)
    q.pop_front(n)
    q.push_back(list(range(n)))
    ref: OrderedDict[int, None] = OrderedDict((i, None) for i in range(n))
    rnd = random.Random(3)
    for _ in range(20 * n):
        b = rnd.randrange(n)
        if b in ref:  # a prefix hit takes it from the middle, its request frees it to the back again
            q.remove([b])
            del ref[b]
        else:
            got = q.pop_front(1)
            want = ref.popitem(last=False)[0]
            assert got == [want]
            b = want
        q.push_back([b])
        ref[b] = None
    assert q.live_ids().tolist() == list(ref)
    assert len(q._back) <= 2 * n + 1024  # compaction keeps garbage below half the list


def test_take_is_pop_front_or_none_through_compactions():
    """`take` (the allocator's call) returns what pop_front would, across the back part's compactions, and None
    rather than raising when too few blocks are queued."""
    n = 3000
    q, ref = FreeQueue(n), FreeQueue(n)
    for x in (q, ref):
        x.pop_front(n)
        x.push_back(list(range(n)))
    for _ in range(n):
        got, want = q.take(1), ref.pop_front(1)
        assert got == want
        q.push_back(got)
        ref.push_back(want)
    assert q.live_ids().tolist() == ref.live_ids().tolist()
    assert q.take(n + 1) is None and len(q) == n


def test_dead_entries_and_rebuilds_keep_the_lru_order_and_the_count(monkeypatch):
    """Blocks hit from the middle of the back part (dead entries, counted per block, skipped by pops) and
    freed to the back again, in batches (`discard_many`, `take` of many): order, count and membership match a
    reference LRU at every step, through prefix drops and rebuilds, and `back_ids` (read only) skips dead
    entries without changing what pops return."""
    monkeypatch.setattr(free_queue, "_COMPACT_MIN", 64)  # collections after 64 entries of garbage, not 1024
    calls = {"_rebuild": 0, "_drop_popped": 0}

    class Counted(FreeQueue):
        __slots__ = ()

        def _rebuild(self):
            calls["_rebuild"] += 1
            super()._rebuild()

        def _drop_popped(self):
            calls["_drop_popped"] += 1
            super()._drop_popped()

    n = 1500
    q = Counted(n)
    ref: OrderedDict[int, None] = OrderedDict((i, None) for i in range(n))
    held: set[int] = set()
    rnd = random.Random(11)
    for step in range(6000):
        op = rnd.random()
        if op < 0.3 and ref:
            k = rnd.randint(1, min(40, len(ref)))
            got = q.take(k)
            assert got == [ref.popitem(last=False)[0] for _ in range(k)]
            held.update(got)
        elif op < 0.65 and held:
            batch = rnd.sample(sorted(held), rnd.randint(1, min(40, len(held))))
            held.difference_update(batch)
            q.push_back(batch)
            ref.update((b, None) for b in batch)
        elif op < 0.7 and held:
            batch = rnd.sample(sorted(held), rnd.randint(1, min(5, len(held))))
            held.difference_update(batch)
            q.push_front(batch)
            for b in reversed(batch):
                ref[b] = None
                ref.move_to_end(b, last=False)
        elif ref:
            batch = rnd.sample(list(ref), rnd.randint(1, min(30, len(ref))))
            assert q.discard_many(batch) == len(batch)
            for b in batch:
                del ref[b]
            held.update(batch)
        assert len(q) == len(ref)
        if step % 97 == 0:
            assert q.live_ids().tolist() == list(ref)
            assert all(q.contains(list(ref)))
            assert not any(q.contains(sorted(held)))
    assert calls["_rebuild"] and calls["_drop_popped"]
    assert q.live_ids().tolist() == list(ref)
    assert q.take(len(ref) + 1) is None and len(q) == len(ref)
    assert q.discard_many(sorted(held)[:3]) == 0
