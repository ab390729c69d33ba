"""The complete holder search (issue 12): linked structures at many depths under one holder, roots the
garbage collector cannot show (done asyncio tasks, contextvars, other threads' frames), objects held only
from C, and an auditor that does not change what it measures."""

import asyncio
import atexit
import contextvars
import functools
import gc
import threading
import types
import weakref

import torch

from kvguardian.core.tensors.holders import find_holder_chains
from kvguardian.core.tensors.holders.access import frame_locals, instance_attrs, safe_attr
from kvguardian.core.tensors.storage import storage_key

APP_MODULE = "complete_app"  # the `app` fixture (conftest.py)


def kv():
    return torch.zeros(1, 2, 4, 8)


class Turn:
    def __init__(self, parent, cache):
        self.parent = parent
        self.cache = cache


def test_every_member_of_a_linked_history_is_named_and_the_structure_is_one_collection(app):
    def build():
        keys, turn = [], None
        for _ in range(30):
            t = kv()
            keys.append(storage_key(t))
            turn = Turn(turn, t)
        app.LAST = turn
        return keys

    keys = build()
    chains = find_holder_chains(keys)
    assert all(chains[k].complete and chains[k].steps[0] == "module complete_app: LAST" for k in keys)
    oldest, newest = chains[keys[0]], chains[keys[-1]]
    assert oldest.steps.count("Turn.parent") == 29 and newest.steps[1] == "Turn.cache"
    head = oldest.nodes[0]
    assert oldest.linked == {head: "Turn.parent"} and oldest.sizes[head] == 30
    assert newest.nodes[0] == head  # the newest turn's chain goes through the same head


def test_same_answer_whatever_was_materialised_before(app):
    """A holder met at two depths is linked, not skipped: materialising some instance dicts (one hop more)
    must not change which chains are found."""

    def build():
        shared = types.SimpleNamespace(items=[])
        keys = []
        for i in range(6):
            holder = Turn(None, kv())
            keys.append(storage_key(holder.cache))
            shared.items.append(holder)
            if i % 2:
                _ = holder.__dict__  # materialised: the cache is now two hops from its Turn
        app.SHARED = shared
        return keys

    keys = build()
    chains = find_holder_chains(keys)
    assert {chains[k].steps[0] for k in keys} == {"module complete_app: SHARED"}
    assert all(chains[k].steps[1:3] == ["SimpleNamespace.items", f"list[{i}]"] for i, k in enumerate(keys))


def test_done_asyncio_tasks_in_a_set_hold_their_results(app):
    async def work():
        return {"kv": kv()}

    async def main():
        tasks = set()
        for _ in range(3):
            t = asyncio.ensure_future(work())
            tasks.add(t)
        await asyncio.gather(*tasks)
        return tasks

    app.BACKGROUND = asyncio.run(main())
    keys = [storage_key(t.result()["kv"]) for t in app.BACKGROUND]
    chains = find_holder_chains(keys)
    for k in keys:
        c = chains[k]
        assert c.complete and c.steps[0] == "module complete_app: BACKGROUND", c.render()
        assert c.steps[1] == "set" and c.steps[2] == "Task.result()"


def test_contextvar_of_this_thread_is_a_root():
    var = contextvars.ContextVar("request_kv")
    ctx = contextvars.Context()

    def inside():
        var.set(kv())
        k = storage_key(var.get())
        c = find_holder_chains([k])[k]
        return c

    c = ctx.run(inside)
    assert c.complete and c.root == "context" and c.steps[0] == "contextvar request_kv"


def test_another_threads_contextvar_is_held_by_its_context():
    var = contextvars.ContextVar("tenant_kv")
    ready, done = threading.Event(), threading.Event()
    box = {}

    def worker():
        var.set(kv())
        box["k"] = storage_key(var.get())
        ready.set()
        done.wait(10)

    th = threading.Thread(target=worker)
    th.start()
    ready.wait(10)
    try:
        c = find_holder_chains([box["k"]])[box["k"]]
        assert c.complete and c.root == "context", c.render()
        assert c.steps[0].startswith("contextvars.Context (a thread's current context")
        assert c.steps[1] == "contextvar tenant_kv"
    finally:
        done.set()
        th.join()


def test_other_threads_frames_are_roots_named_by_thread():
    ready, done = threading.Event(), threading.Event()
    box = {}

    def worker():
        held = kv()
        box["k"] = storage_key(held)
        ready.set()
        done.wait(10)

    th = threading.Thread(target=worker, name="decode-worker")
    th.start()
    ready.wait(10)
    try:
        c = find_holder_chains([box["k"]])[box["k"]]
        assert c.complete and c.root == "frame"
        assert c.steps[0].startswith("frame worker()") and "[thread decode-worker] local held" in c.steps[0]
    finally:
        done.set()
        th.join()


def test_held_only_from_c_names_the_nearest_python_objects():
    def build():
        cache = {"kv": kv()}
        fn = lambda: cache  # noqa: E731 - an atexit closure, the shape under test
        atexit.register(fn)
        return storage_key(cache["kv"]), weakref.ref(fn)

    k, fn_ref = build()
    try:
        c = find_holder_chains([k])[k]
        assert not c.complete and c.root == "c"
        assert c.steps[0].startswith("held from outside Python (C), nearest Python object: function")
        assert "<lambda>" in c.steps[0] and "closure cell cache" in c.render()
    finally:
        atexit.unregister(fn_ref())


class Plain:
    def __init__(self):
        self.cache = kv()
        self.n = 3


def test_reading_attributes_never_materialises_the_instance_dict():
    obj = Plain()
    before = [type(x).__name__ for x in gc.get_referents(obj)]
    assert "dict" not in before  # 3.11+: inline values
    names = dict(instance_attrs(obj))
    assert names["cache"] is obj.cache and names["n"] == 3
    assert safe_attr(obj, "cache") is obj.cache
    assert [type(x).__name__ for x in gc.get_referents(obj)] == before


def test_search_and_rendering_leave_instance_dicts_and_frame_snapshots_as_they_were(app):
    def build():
        objs = [Plain() for _ in range(3)]
        app.OBJS = objs
        return [storage_key(o.cache) for o in objs]

    keys = build()
    shapes = [[type(x).__name__ for x in gc.get_referents(o)] for o in app.OBJS]
    chains = find_holder_chains(keys)
    assert all(chains[k].steps[2] == "Plain.cache" for k in keys)
    assert [[type(x).__name__ for x in gc.get_referents(o)] for o in app.OBJS] == shapes

    def gen():
        held = kv()  # noqa: F841
        yield

    g = gen()
    next(g)
    held = next(v for name, v in frame_locals(g.gi_frame, may_undo=True) if name == "held")
    assert [r for r in gc.get_referrers(held) if isinstance(r, dict)] == [], "the f_locals snapshot was emptied"


class Lazy:
    calls = 0

    def __init__(self):
        self.cache = kv()

    @property
    def size(self):
        Lazy.calls += 1
        return 0

    @functools.cached_property
    def summary(self):
        Lazy.calls += 1
        return self.cache.shape

    def __getattr__(self, name):
        Lazy.calls += 1
        raise AttributeError(name)


def test_naming_attributes_runs_no_property_cached_property_or_getattr(app):
    def build():
        app.HOLDERS = [Lazy() for _ in range(2)]
        return [storage_key(o.cache) for o in app.HOLDERS]

    keys = build()
    chains = find_holder_chains(keys)
    assert all(chains[k].steps[2] == "Lazy.cache" for k in keys)
    assert Lazy.calls == 0


def test_numpy_arrays_on_kv_memory_are_holders_though_the_gc_does_not_track_them(app):
    # tensor.numpy() shares the tensor's memory and keeps a tensor alive as its .base; numpy arrays are not
    # tracked by the garbage collector, so gc.get_referrers never returns them (the chain used to end at
    # "held from outside Python (C), nearest Python object: Tensor")
    app.KEPT = [kv().numpy() for _ in range(2)]
    app.VIEWS = {"v": kv().numpy()[0, :1]}  # a view keeps its base array, which keeps the tensor
    keys = [storage_key(a.base) for a in app.KEPT] + [storage_key(app.VIEWS["v"].base.base)]
    chains = find_holder_chains(keys)
    for k, head in zip(keys, ["module complete_app: KEPT", "module complete_app: KEPT", "module complete_app: VIEWS"]):
        c = chains[k]
        assert c.complete and c.steps[0] == head, c.render()
        assert "ndarray.base" in c.steps, c.render()


class Output:
    """What a request returns: an object holding the request's cache (as a generate output does)."""

    def __init__(self, cache):
        self.past_key_values = cache


def _scans(monkeypatch):
    import sys

    search_mod = sys.modules["kvguardian.core.tensors.holders.search"]
    real = search_mod._referrers
    calls = []

    def counted(lv):
        calls.append(len(lv.frontier))
        return real(lv)

    monkeypatch.setattr(search_mod, "_referrers", counted)
    return calls


def _sessions(app, n):
    app.SESSIONS = {}
    for i in range(n):
        out = Output([kv()])
        vars(out)  # the instance dict exists (as for most objects): one more object between output and cache
        app.SESSIONS[f"s{i}"] = out


def _seeds(app):
    return {storage_key(o.past_key_values[0]): o.past_key_values for o in app.SESSIONS.values()}


def test_hints_save_a_heap_scan_and_change_no_chain(app, monkeypatch):
    """Hints (what each request returned) join the first level: the same chains, fewer heap scans; a wrong
    hint (an object holding nothing of the starts) changes nothing either."""
    _sessions(app, 6)
    keys = list(_seeds(app))
    calls = _scans(monkeypatch)
    plain = find_holder_chains(keys, seeds=_seeds(app))
    without = len(calls)
    calls.clear()
    hinted = find_holder_chains(keys, seeds=_seeds(app), hints=list(app.SESSIONS.values()))
    with_hints = len(calls)
    calls.clear()
    wrong = find_holder_chains(keys, seeds=_seeds(app), hints=[Output(None) for _ in range(6)])
    assert all(plain[k].complete and plain[k].steps[0] == "module complete_app: SESSIONS" for k in keys)
    assert [hinted[k].steps for k in keys] == [plain[k].steps for k in keys]
    assert [wrong[k].steps for k in keys] == [plain[k].steps for k in keys]
    assert without == 3 and with_hints == 1 and len(calls) == without  # list ← __dict__ ← Output ← SESSIONS


def test_a_hint_never_hides_a_shorter_chain(app):
    """The hinted holder is a long way round; a module global holds the cache directly: the global wins."""
    _sessions(app, 1)
    app.DIRECT = app.SESSIONS["s0"].past_key_values
    key = storage_key(app.DIRECT[0])
    chain = find_holder_chains([key], seeds={key: app.DIRECT}, hints=[app.SESSIONS["s0"]])[key]
    assert chain.complete and chain.steps[0] == "module complete_app: DIRECT"
