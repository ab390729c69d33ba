"""Small facts about Python expressions that several rules share: dotted names, what looks like a KV cache
or a model's output, what embeds a timestamp or UUID, what is an exception or traceback, what is a container.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

__all__ = [
    "call_name",
    "container_kind",
    "dotted",
    "grad_effect",
    "is_request_id",
    "keyword",
    "names_in",
    "resolve",
]

_CACHE_NAME = re.compile(
    r"^(past(_key_values?)?|(kv|key|value|k|v|layer|past)_?caches?|key_values|past_kvs?|present_key_values?"
    r"|(self_attn|cross_attn)_cache|dynamic_cache|static_cache)$", re.IGNORECASE)
_CACHE_ATTR = {"past_key_values", "past_key_value", "key_cache", "value_cache", "kv_cache", "kv_caches",
               "present_key_values"}
_CACHE_CLASSES = {"DynamicCache", "StaticCache", "QuantizedCache", "HybridCache", "OffloadedCache", "SinkCache",
                  "SlidingWindowCache", "EncoderDecoderCache", "HQQQuantizedCache", "QuantoQuantizedCache"}
_OUTPUT_METHODS = {"generate", "greedy_search", "beam_search"}
_COPIES = {"detach", "clone", "to", "cpu", "cuda", "copy", "contiguous"}
_TIME_CALLS = {"time.time", "time.time_ns", "time.monotonic_ns", "time.perf_counter_ns", "uuid.uuid1",
               "uuid.uuid4", "uuid4", "uuid1", "datetime.now", "datetime.utcnow", "datetime.datetime.now",
               "datetime.datetime.utcnow", "time_ns", "uuid.uuid7", "uuid7", "shortuuid.uuid", "secrets.token_hex",
               "ulid.new", "ULID"}
_EXC_CALLS = {"sys.exc_info", "sys.exception", "inspect.currentframe", "sys._getframe", "inspect.trace",
              "inspect.stack"}
_EXC_ATTRS = {"__traceback__", "tb_frame", "last_traceback", "last_value", "last_exc", "f_back", "f_locals"}
_REQUEST_ID = re.compile(r"^(req|request|seq|sequence|session|conv|conversation|client|user|job|task|response)_?"
                         r"(id|uid|uuid|key)$|^rid$|^sid$|^uid$", re.IGNORECASE)
_CONTAINERS = {"list", "dict", "set", "deque", "defaultdict", "OrderedDict", "Counter", "collections.deque",
               "collections.defaultdict", "collections.OrderedDict", "collections.Counter", "typing.List",
               "typing.Dict"}
_WEAK = {"WeakValueDictionary", "WeakKeyDictionary", "WeakSet", "weakref.WeakValueDictionary",
         "weakref.WeakKeyDictionary", "weakref.WeakSet"}
_GRAD_OFF = {"torch.no_grad", "torch.inference_mode", "no_grad", "inference_mode", "torch.autograd.no_grad",
             "torch.autograd.inference_mode", "torch.autograd.grad_mode.no_grad",
             "torch.autograd.grad_mode.inference_mode"}
_GRAD_SET = {"torch.set_grad_enabled", "set_grad_enabled", "torch.autograd.set_grad_enabled"}
_GRAD_ON = {"torch.enable_grad", "enable_grad", "torch.autograd.enable_grad"}
_GRAD_NAMES = _GRAD_OFF | _GRAD_SET | _GRAD_ON


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def resolve(name: str | None, imports: Mapping[str, str] | None) -> str | None:
    """``name`` with its first part replaced by what the module imported under it: ``th.no_grad`` ->
    ``torch.no_grad`` (``import torch as th``), ``nograd`` -> ``torch.no_grad`` (``from torch import no_grad as
    nograd``), ``time()`` -> ``time.time`` (``from time import time``)."""
    if not name or not imports:
        return name
    head, dot, rest = name.partition(".")
    full = imports.get(head)
    return f"{full}{dot}{rest}" if full else name


def _named(name: str | None, imports: Mapping[str, str] | None, table: set[str]) -> str | None:
    """``name`` resolved through ``imports`` when that is in ``table``, else ``name`` as written (a bare
    ``no_grad`` from a module of one's own still reads as torch's, as before imports were resolved)."""
    full = resolve(name, imports)
    return full if full in table else name


def call_name(node: ast.Call) -> str | None:
    return dotted(node.func)


def method_of(node: ast.Call) -> str | None:
    """The attribute name of ``x.m(...)``, else None."""
    return node.func.attr if isinstance(node.func, ast.Attribute) else None


def keyword(node: ast.Call, name: str) -> ast.expr | None:
    for kw in node.keywords:
        if kw.arg == name:
            return kw.value
    return None


def names_in(node: ast.AST) -> set[str]:
    """Every Name read in ``node``."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def is_none(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def is_false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def grad_effect(node: ast.expr, imports: Mapping[str, str] | None = None) -> int:
    """For a ``with`` item or decorator: -1 turns grad off, +1 turns it on, 0 neither. Names are resolved
    through the module's ``imports`` (local name -> what it names)."""
    target = node.func if isinstance(node, ast.Call) else node
    name = _named(dotted(target), imports, _GRAD_NAMES)
    if name in _GRAD_OFF:
        if isinstance(node, ast.Call) and name and name.endswith("inference_mode"):
            mode = node.args[0] if node.args else keyword(node, "mode")
            if is_false(mode):
                return 0
        return -1
    if name in _GRAD_ON:
        return 1
    if name in _GRAD_SET and isinstance(node, ast.Call):
        arg = node.args[0] if node.args else keyword(node, "mode")
        return -1 if is_false(arg) else (1 if is_true(arg) else 0)
    return 0


def _parts(node: ast.AST) -> list[ast.expr] | None:
    """What a container display, subscript or starred expression holds (it holds what they hold), else None."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return list(node.elts)
    if isinstance(node, ast.Dict):
        return [v for v in node.values if v is not None]
    if isinstance(node, (ast.Subscript, ast.Starred)):
        return [node.value]
    return None


def is_cache_expr(node: ast.AST, kv_names: set[str]) -> bool:
    """Is ``node`` a KV cache or a model's generate() output: a cache name, a cache attribute, a cache
    constructor, a generate() call, a model call fed a cache, a tainted name - or a tuple, list, dict, subscript,
    comprehension, walrus or copy of one? Arbitrary calls on a cache (``len(past)``, ``f(past)``) are not: they
    return something else.
    """
    if isinstance(node, ast.Name):
        return node.id in kv_names or bool(_CACHE_NAME.match(node.id))
    if isinstance(node, ast.Attribute):
        return node.attr in _CACHE_ATTR
    parts = _parts(node)
    if parts is not None:
        return any(is_cache_expr(p, kv_names) for p in parts)
    if isinstance(node, ast.IfExp):
        return is_cache_expr(node.body, kv_names) or is_cache_expr(node.orelse, kv_names)
    if isinstance(node, (ast.Await, ast.NamedExpr)):  # `await x`, `(out := x)`: what x is
        return is_cache_expr(node.value, kv_names)
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return is_cache_expr(node.value if isinstance(node, ast.DictComp) else node.elt, kv_names)
    if isinstance(node, ast.Call):
        name = call_name(node) or ""
        tail = name.rsplit(".", 1)[-1]
        if tail in _CACHE_CLASSES or (tail in _OUTPUT_METHODS and isinstance(node.func, ast.Attribute)) \
                or name == "generate":  # an app's own `generate()` wrapper around model.generate
            return True
        if keyword(node, "past_key_values") is not None or is_true(keyword(node, "use_cache")):
            return True
        if tail in _COPIES and isinstance(node.func, ast.Attribute):
            return is_cache_expr(node.func.value, kv_names)
        if name in ("copy.copy", "copy.deepcopy") and node.args:
            return is_cache_expr(node.args[0], kv_names)
    return False


def is_time_expr(node: ast.AST, tainted: set[str], imports: Mapping[str, str] | None = None) -> bool:
    """Does ``node`` embed a wall-clock timestamp or a random UUID (directly or through a tainted name)? Call
    names are resolved through the module's ``imports`` (``t.time()`` after ``import time as t``)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            name = _named(call_name(n), imports, _TIME_CALLS)
            if name in _TIME_CALLS or (name and name.rsplit(".", 1)[-1] in ("uuid4", "uuid1", "time_ns")):
                return True
        elif isinstance(n, ast.Name) and n.id in tainted:
            return True
    return False


def is_exc_expr(node: ast.AST, exc_names: set[str]) -> bool:
    """Is ``node`` an exception, traceback or frame (or a tuple/list/subscript holding one)? A formatted copy
    (``str(e)``, an f-string, ``traceback.format_exc()``) or an attribute such as ``e.args`` is not."""
    if isinstance(node, ast.Name):
        return node.id in exc_names
    if isinstance(node, ast.Attribute):
        return node.attr in _EXC_ATTRS
    if isinstance(node, ast.Call):
        return call_name(node) in _EXC_CALLS
    parts = _parts(node)
    return parts is not None and any(is_exc_expr(p, exc_names) for p in parts)


def is_request_id(node: ast.AST) -> bool:
    """A subscript key that names a request: ``rid``, ``request_id``, ``req.request_id``, ``seq.seq_id``…"""
    if isinstance(node, ast.Name):
        return bool(_REQUEST_ID.match(node.id))
    if isinstance(node, ast.Attribute):
        return bool(_REQUEST_ID.match(node.attr))
    return False


def container_kind(node: ast.AST | None) -> str | None:
    """``"bounded"``, ``"unbounded"`` or None (not a strong container) for a container-building expression."""
    if isinstance(node, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return "unbounded"
    if isinstance(node, ast.Call):
        name = call_name(node) or ""
        if name in _WEAK or name.rsplit(".", 1)[-1] in _WEAK:
            return None
        if name in _CONTAINERS or name.rsplit(".", 1)[-1] in ("deque", "defaultdict", "OrderedDict", "Counter"):
            if name.endswith("deque"):
                maxlen = keyword(node, "maxlen") or (node.args[1] if len(node.args) > 1 else None)
                return "unbounded" if maxlen is None or is_none(maxlen) else "bounded"
            return "unbounded"
    return None
