"""Holder chains for the shapes leaks take: globals, closures, tracebacks, attributes, lru_cache, classes,
generators, autograd graphs. Each scenario is built inside a function that returns only the storage key
(an int), so the test's own frame holds nothing and the chain must start at the real root."""

import functools
import re
import typing

import pytest
import torch

from kvguardian.core.tensors.holders import find_holder_chains
from kvguardian.core.tensors.storage import storage_key

APP_MODULE = "leaky_app"  # the `app` fixture (conftest.py)


def kv(n=16):
    return torch.zeros(1, 2, n, 8)


def chain(ref, **kw):
    return find_holder_chains([ref], max_seconds=20, **kw)[ref]


class Layer:
    def __init__(self, k):
        self.keys = k


class Cache:
    def __init__(self, k):
        self.layers = [Layer(k)]


def test_module_global_dict_and_attributes(app):
    def build():
        t = kv()
        app.SESSIONS = {"r-3": Cache(t)}
        return storage_key(t)

    c = chain(build())
    assert c.complete and c.root == "module"
    assert c.steps[:5] == ["module leaky_app: SESSIONS", "dict['r-3']", "Cache.layers", "list[0]", "Layer.keys"]
    assert c.steps[-1] == "Tensor[1×2×16×8] float32"
    assert c.render().startswith("module leaky_app: SESSIONS → dict['r-3'] → Cache.layers")


def test_free_text_keys_are_never_shown(app):
    def build():
        t = kv()
        app.MEMO = {"Tell me a secret about my account": t}
        return storage_key(t)

    ref = build()
    steps = chain(ref).steps
    assert "secret" not in " ".join(steps)
    assert steps[1] == "dict[<str len=33>]"
    app.NAMED = {"r-1": app.MEMO}
    assert "r-1" not in " ".join(chain(ref, redact=True).steps)


def test_closure_in_global_hook_list(app):
    def build():
        def make_hook(kv_tensor):
            def hook():
                return kv_tensor.shape

            return hook

        t = kv()
        app.HOOKS = [make_hook(t)]
        return storage_key(t)

    c = chain(build())
    assert c.steps[:2] == ["module leaky_app: HOOKS", "list[0]"]
    assert c.steps[2].startswith("function ") and c.steps[2].endswith("hook() closure cell kv_tensor")
    assert c.steps[3].startswith("Tensor[")


def test_kept_traceback_frame_local(app):
    def handle():
        local_kv = kv()  # noqa: F841 - kept alive by the traceback's frame
        raise ValueError("boom")

    def build():
        try:
            handle()
        except ValueError as exc:
            app.FAILED = [exc]
        tb = app.FAILED[0].__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        return storage_key(tb.tb_frame.f_locals["local_kv"])

    c = chain(build())
    text = c.render()
    assert c.steps[:3] == ["module leaky_app: FAILED", "list[0]", "ValueError.__traceback__"]
    assert "traceback" in text and "frame handle()" in text and "local local_kv" in text


def test_lru_cache_on_method_holding_self(app):
    def build():
        class Encoder:
            def __init__(self):
                self.weight = kv(4)

            @functools.lru_cache(maxsize=8)  # noqa: B019 - the leak under test
            def encode(self, prefix):
                return (kv(32),)

        app.Encoder = Encoder
        return storage_key(Encoder().encode("system")[0])

    c = chain(build())
    assert c.complete and c.root == "class"
    assert c.steps[0] == f"class {__name__}.Encoder: encode"  # class attributes are roots, like globals
    assert c.steps[1] == "lru_cache Encoder.encode()"
    assert c.steps[2] == "tuple[0]"


def test_unbounded_lru_cache_function(app):
    def build():
        @functools.lru_cache(maxsize=None)  # noqa: UP033 - the spelling users write
        def prefix_cache(n):
            return [kv(n)]

        app.prefix_cache = prefix_cache
        return storage_key(prefix_cache(8)[0])

    c = chain(build())
    assert c.steps[0] == "module leaky_app: prefix_cache"
    assert c.steps[1] == "lru_cache prefix_cache() cached result"


def test_class_attribute(app):
    def build():
        class Engine:
            CACHE: typing.ClassVar[list] = []

        app.Engine = Engine
        t = kv()
        Engine.CACHE.append(t)
        return storage_key(t)

    c = chain(build())
    assert c.steps[:2] == [f"class {__name__}.Engine: CACHE", "list[0]"]


def test_suspended_generator(app):
    def build():
        def stream():
            held = kv()  # noqa: F841
            yield 1

        gen = stream()
        next(gen)
        app.STREAMS = [gen]
        return storage_key(gen.gi_frame.f_locals["held"])

    c = chain(build())
    assert c.steps[:2] == ["module leaky_app: STREAMS", "list[0]"]
    assert c.steps[2] == "generator stream() local held"


def test_executing_frame_local_is_a_root():
    t = kv()
    c = chain(storage_key(t))
    assert c.root == "frame" and c.complete
    assert c.steps[0].startswith("frame test_executing_frame_local_is_a_root()") and c.steps[0].endswith("local t")


def test_autograd_graph_holder(app):
    def build():
        w = torch.ones(8, 8, requires_grad=True)
        saved = torch.ones(1, 8) * 2  # saved for backward by the matmul
        app.OUT = saved @ w
        return storage_key(saved)

    c = chain(build())
    assert c.steps[0] == "module leaky_app: OUT"
    assert "grad_fn graph (saved for backward)" in c.render()


def test_unreachable_from_python_is_reported_as_such():
    c = chain(123456789)
    assert not c.complete and c.root == "none" and c.notes


def test_search_is_bounded_by_objects_visited_and_says_so(app):
    def build():
        t = kv()
        node = t
        for _ in range(25):
            node = [node]
        app.DEEP = node
        return storage_key(t)

    ref = build()
    c = chain(ref, max_objects=10)
    assert not c.complete and c.stopped and c.root == "none"
    m = re.match(r"<search stopped after (\d+) objects; nearest Python object: (\w+)>", c.steps[0])
    assert m and int(m.group(1)) >= 10, c.steps[0]  # a level may add a few more than the budget
    assert f"search stopped after {m.group(1)} objects" in c.notes[0]
    full = chain(ref)
    assert full.complete and full.steps[0] == "module leaky_app: DEEP" and full.depth == 26


def test_more_shapes_partial_deque_thread_local_bound_method(app):
    import collections
    import threading

    def build():
        out = {}

        class Svc:
            def __init__(self):
                self.kv = kv()

            def run(self):
                pass

        svc = Svc()
        app.CALLBACKS = [svc.run]
        out["bound"] = storage_key(svc.kv)
        t = kv()
        app.REG = {"cb": functools.partial(print, t)}
        out["partial"] = storage_key(t)
        t = kv()
        app.Q = collections.deque([0, t])
        out["deque"] = storage_key(t)
        app.TLS = threading.local()
        app.TLS.cache = kv()
        out["tls"] = storage_key(app.TLS.cache)
        return out

    refs = build()
    chains = find_holder_chains(list(refs.values()), max_seconds=20)
    render = {name: chains[k].render() for name, k in refs.items()}
    assert render["bound"].startswith("module leaky_app: CALLBACKS → list[0] → bound method Svc.run() self → Svc.kv")
    assert render["partial"].startswith("module leaky_app: REG → dict['cb'] → partial.args[0] → Tensor")
    assert render["deque"].startswith("module leaky_app: Q → deque[1] → Tensor")
    assert render["tls"].startswith("module leaky_app: TLS → threading.local (one thread's attributes) → dict['cache']")


def test_a_class_made_at_run_time_is_not_a_root_its_registry_is(app):
    def build():
        t = kv()
        cls = type("Handler7", (), {"cache": Cache(t)})
        app.HANDLERS = {"h7": cls}  # the class is in a container, bound by no module
        return storage_key(t)

    c = chain(build())
    assert c.complete and c.root == "module"
    assert c.steps[:3] == ["module leaky_app: HANDLERS", "dict['h7']", "class Handler7.cache"]


def test_a_c_buffer_holding_many_items_is_a_collection(app):
    import itertools

    def build():
        ts = [kv(4 + i) for i in range(5)]
        main, app.AUDIT = itertools.tee(Cache(t) for t in ts)
        for _ in main:
            pass
        return storage_key(ts[2])

    c = chain(build())
    assert c.steps[0] == "module leaky_app: AUDIT"
    buffers = [n for n, step in zip(c.nodes, c.node_steps) if "tee_dataobject" in step]
    assert buffers and buffers[0] in c.containers and c.sizes[buffers[0]] == 5  # five caches, no Python container


def test_a_numpy_array_of_objects_holds_its_items(app):
    np = pytest.importorskip("numpy")

    def build():
        ts = [kv(4 + i) for i in range(3)]
        app.TABLE = np.empty(8, dtype=object)
        for i, t in enumerate(ts):
            app.TABLE[i] = Cache(t)
        return storage_key(ts[1])

    c = chain(build())
    assert c.complete and c.steps[:2] == ["module leaky_app: TABLE", "ndarray[1] (flat)"]
    assert c.nodes[0] in c.containers and c.sizes[c.nodes[0]] == 3  # three caches in it, gc sees none of them
