"""Holder chains through what the interpreter holds outside any object (trace/profile functions, signal
handlers) and through attributes that live in unusual places (a function's ``__dict__``, a dict subclass's
own attributes, an instance ``__dict__`` replaced by a dict subclass, registries keyed by classes)."""

import asyncio
import enum
import functools
import signal
import sys
import types
import weakref

import torch

from kvguardian.core.tensors.holders import find_holder_chains
from kvguardian.core.tensors.holders.edges import key_repr
from kvguardian.core.tensors.storage import storage_key

APP_MODULE = "hooks_app"  # the `app` fixture (conftest.py)


def kv():
    return torch.zeros(1, 2, 4, 8)


def _profiler_holding(keys):
    seen = [kv() for _ in range(3)]
    keys.extend(storage_key(t) for t in seen)

    def prof(frame, event, arg):
        return None

    prof.seen = seen  # a profiler's per-call records, the shape under test
    return prof


def test_a_profile_function_is_a_root_and_its_attributes_are_named():
    keys: list = []
    prof = _profiler_holding(keys)
    old = sys.getprofile()
    sys.setprofile(prof)
    del prof
    try:
        chains = find_holder_chains(keys)
    finally:
        sys.setprofile(old)
    for k in keys:
        c = chains[k]
        assert c.complete and c.root == "interpreter", c.render()
        assert c.steps[0] == "sys.getprofile() (this thread's profile function)"
        assert c.steps[1] == "function prof().seen", c.render()


class Stats:
    def __init__(self):
        self.outs = []

    def dump(self, signum, frame):  # pragma: no cover - never delivered
        return len(self.outs)


def test_a_signal_handler_is_a_root():
    def install():
        s = Stats()
        s.outs.extend(kv() for _ in range(2))
        return signal.signal(signal.SIGUSR1, s.dump), [storage_key(t) for t in s.outs]

    old, keys = install()
    try:
        chains = find_holder_chains(keys)
    finally:
        signal.signal(signal.SIGUSR1, old)
    for k in keys:
        c = chains[k]
        assert c.complete and c.root == "interpreter", c.render()
        assert c.steps[0] == "signal handler SIGUSR1"
        assert c.steps[1:3] == ["bound method Stats.dump() self", "Stats.outs"], c.render()


class HistDict(dict):
    def __init__(self):
        super().__init__()
        self.history = []


class Worker:
    pass


def test_an_instance_dict_that_is_a_dict_subclass_and_its_own_attributes_are_named(app):
    def build():
        w = Worker()
        w.__dict__ = HistDict()
        w.__dict__["name"] = "w"
        w.__dict__.history.extend(kv() for _ in range(2))
        app.W = w
        return [storage_key(t) for t in w.__dict__.history]

    keys = build()
    chains = find_holder_chains(keys)
    for k in keys:
        c = chains[k]
        want = ["module hooks_app: W", "Worker.__dict__ (HistDict)", "HistDict.history"]
        assert c.complete and c.steps[:3] == want, c.render()


def test_a_registry_keyed_by_class_names_the_class(app):
    @functools.singledispatch
    def render(x):  # pragma: no cover - never called
        return x

    def build():
        keys = []
        for i in range(2):
            t = kv()
            keys.append(storage_key(t))
            render.register(type(f"Req{i}", (), {}))(lambda x, t=t: t)
        app.render = render
        return keys

    keys = build()
    chains = find_holder_chains(keys)
    assert {chains[k].steps[1] for k in keys} == {"function render().registry"}
    assert {chains[k].steps[3] for k in keys} == {"dict[<class Req0>]", "dict[<class Req1>]"}


def test_key_repr_of_one_tuples_and_classes():
    assert key_repr(("s0",), False) == "('s0',)"
    assert key_repr((Worker, ("s0",)), False) == "(<class Worker>, ('s0',))"
    assert key_repr(Worker, True) == "<type>"
    assert key_repr(type("has space", (), {}), False) == "<class>"


def test_token_id_tuples_are_never_shown():
    """A prompt cache keyed by its token ids: the key is the prompt; only its length is shown."""
    assert key_repr((15, 36, 46, 50, 7, 99), False) == "<tuple of 6 ints>"
    assert key_repr(("tenant", 3), False) == "('tenant', 3)" and key_repr((1, 2, 3), False) == "(1, 2, 3)"


def test_backward_hooks_on_a_long_lived_parameter_are_named(app):
    weight = torch.nn.Parameter(torch.zeros(2))

    def build():
        keys = []
        for _ in range(2):
            t = kv()
            keys.append(storage_key(t))
            weight.register_hook(lambda g, t=t: g)  # a debugging hook capturing a request's KV
        app.W = weight
        return keys

    keys = build()
    chains = find_holder_chains(keys)
    assert {tuple(chains[k].steps[:2]) for k in keys} == {("module hooks_app: W", "Parameter._backward_hooks")}


def test_builtin_bound_methods_kept_as_callbacks_are_named(app):
    def build():
        sinks = [[kv()] for _ in range(2)]
        app.LISTENERS = [s.append for s in sinks]  # callbacks that are C methods of per-request lists
        return [storage_key(s[0]) for s in sinks]

    keys = build()
    chains = find_holder_chains(keys)
    for k in keys:
        assert chains[k].steps[2:4] == ["bound method list.append() self", "list[0]"], chains[k].render()


def test_a_pending_futures_callbacks_are_not_called_its_result(app):
    async def waiter(kv_):
        await app.SHUTDOWN.wait()
        return kv_  # pragma: no cover - never woken

    async def main():
        app.SHUTDOWN = asyncio.Event()
        tasks = [asyncio.ensure_future(waiter(kv())) for _ in range(2)]
        await asyncio.sleep(0)
        keys = [storage_key(t.get_coro().cr_frame.f_locals["kv_"]) for t in tasks]
        del tasks
        return keys

    loop = asyncio.new_event_loop()
    try:
        keys = loop.run_until_complete(main())
        chains = find_holder_chains(keys)
    finally:
        pending = asyncio.all_tasks(loop)
        for t in pending:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
    for k in keys:
        text = chains[k].render()
        assert chains[k].complete and "Future.add_done_callback() callback" in text, text
        assert "bound method Task.task_wakeup() self" in text and "Future.result()" not in text, text


def test_a_local_class_reached_through_its_instance_and_a_module_object_outside_sys_modules(app):
    def build():
        class Handler:  # made per app: not a root, its instance is
            history = [kv()]  # noqa: RUF012 - the shape under test

        plugin = types.ModuleType("plugin0")  # never in sys.modules
        plugin.STATE = {"kv": kv()}
        app.HANDLER, app.PLUGINS = Handler(), [plugin]
        return storage_key(Handler.history[0]), storage_key(plugin.STATE["kv"])

    k_class, k_plugin = build()
    chains = find_holder_chains([k_class, k_plugin])
    assert chains[k_class].steps[:3] == ["module hooks_app: HANDLER", "Handler.__class__", "class Handler.history"]
    assert chains[k_plugin].steps[:4] == ["module hooks_app: PLUGINS", "list[0]", "module object plugin0: STATE",
                                          "dict['kv']"], chains[k_plugin].render()


class Span:
    __slots__ = ("n", "req")

    def __init__(self, req, n):
        self.req = req
        self.n = n


class Request:
    def __init__(self, n_spans):
        self.kv = kv()
        self.spans = [Span(self, n) for n in range(n_spans)]  # tracing spans pointing back at their request


class App:
    def __init__(self):
        self.history = []


def test_thousands_of_back_references_do_not_exhaust_the_budget(app):
    """Each request has more spans pointing back at it than the whole budget: the search leaves those fan-in
    groups unexpanded and finds the history through the request's other referrer."""
    def build():
        app.APP = App()
        app.APP.history.extend(Request(300) for _ in range(8))
        return [storage_key(r.kv) for r in app.APP.history]

    keys = build()
    chains = find_holder_chains(keys, max_objects=1_000)
    for i, k in enumerate(keys):
        c = chains[k]
        assert c.complete and not c.stopped, c.render()
        assert c.steps[:4] == ["module hooks_app: APP", "App.history", f"list[{i}]", "Request.kv"], c.render()


def test_a_start_only_a_deferred_group_leads_to_says_the_search_stopped(app):
    def build():
        req = Request(300)
        app.SPANS = [list(req.spans)]  # the request is held only by its spans, the spans by a global list
        return storage_key(req.kv)

    k = build()
    c = find_holder_chains([k], max_objects=200)[k]
    assert not c.complete and c.stopped and c.root == "none", c.render()
    assert "search stopped after" in c.render() and "held from outside Python" not in c.render()


class Slot(enum.IntEnum):
    A = 1
    B = 2

    def __repr__(self):
        raise RuntimeError("a user __repr__ must not run")

    __str__ = __repr__


class Name(str):
    def __repr__(self):
        raise RuntimeError("a user __repr__ must not run")

    def __len__(self):
        raise RuntimeError("a user __len__ must not run")


def test_keys_of_user_subclasses_are_shown_without_running_their_code(app):
    def build():
        app.BY_SLOT = {Slot.A: kv(), Name("user-1"): kv(), Name("free text"): kv()}
        return [storage_key(t) for t in app.BY_SLOT.values()]

    keys = build()
    chains = find_holder_chains(keys)
    assert [chains[k].steps[1] for k in keys] == ["dict[1]", "dict['user-1']", "dict[<str len=9>]"]
    assert key_repr(Slot.B, True) == "<key>" and key_repr(True, False) == "True"


def test_a_step_whose_naming_raises_costs_its_name_not_the_search(app, monkeypatch):
    from kvguardian.core.tensors.holders import render

    def broken(parent, child, redact=False):
        raise RuntimeError("boom")

    monkeypatch.setattr(render, "render_step", broken)

    def build():
        app.HELD = [kv()]
        return storage_key(app.HELD[0])

    k = build()
    c = find_holder_chains([k])[k]
    assert c.complete and c.steps[:2] == ["module hooks_app: HELD", "list"], c.render()


class State:
    pass


class Engine:
    def __init__(self):
        self.system = kv()
        self.default = kv()


def test_attributes_set_by_computed_names_make_the_instance_a_collection(app):
    def build():
        app.STATE, app.ENGINE = State(), Engine()
        for i in range(5):
            setattr(app.STATE, f"req_{i}", kv())  # one attribute per request, CPython keeps them inline
        return [storage_key(getattr(app.STATE, f"req_{i}")) for i in range(5)]

    keys = build()
    named = [storage_key(app.ENGINE.system), storage_key(app.ENGINE.default)]
    chains = find_holder_chains(keys + named)
    for k in keys:
        c = chains[k]
        assert c.steps[1] == "State.<attribute set by a computed name>", c.render()
        assert c.nodes[0] in c.containers and c.sizes[c.nodes[0]] == 5
    for k in named:  # attributes the class's code names are single references, not a collection
        c = chains[k]
        assert c.steps[1] in ("Engine.system", "Engine.default") and c.nodes[0] not in c.containers, c.render()


def test_staticmethods_properties_and_weakref_callbacks_are_named(app):
    def build():
        a, b, c = kv(), kv(), kv()

        class Api:
            pass

        Api.run = staticmethod(lambda: a)
        Api.result = property(lambda self: b)
        target = State()
        app.KEEP, app.API = [target, weakref.ref(target, lambda r: c)], Api()
        return storage_key(a), storage_key(b), storage_key(c)

    ka, kb, kc = build()
    chains = find_holder_chains([ka, kb, kc])
    assert "staticmethod.__func__" in chains[ka].steps, chains[ka].render()
    assert "property.fget" in chains[kb].steps, chains[kb].render()
    assert chains[kc].steps[:3] == ["module hooks_app: KEEP", "list[1]", "weakref callback"], chains[kc].render()
