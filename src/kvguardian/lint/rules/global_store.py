"""KVG402 global-kv-store: per-request KV or generate() outputs stored into module- or class-level state.

Anti-pattern::

    HISTORY = []                                  # module level: lives as long as the process
    def handle(prompt):
        out = model.generate(ids, return_dict_in_generate=True)
        HISTORY.append(out)                       # every request's cache, forever

Fix: keep per-request results in the request's scope; if they must outlive it, bound the container
(``deque(maxlen=N)``, an LRU that evicts) or remove the entry when the request ends.

Fires on ``append``/``extend``/``add``/``insert``/``setdefault``/``update``/``X[k] = v`` into a container built at
module level, or in a class body (and not shadowed in ``__init__``), inside a function, when the stored value
mentions a KV cache (``past_key_values``, ``DynamicCache(...)``, a ``*_cache`` name) or a ``generate()`` result,
directly or through a local name assigned from one, and nothing in the module ever removes from the
container (``pop``, ``remove``, ``clear``, ``del X[...]``, ``X[:] = ...``, rebinding it).

False positives: removal done by another module, or a container that is bounded by construction (a fixed
key set), is invisible here; silence with ``# noqa: KVG402``.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvguardian.lint.python import names as N
from kvguardian.lint.python.index import ModuleIndex, Store
from kvguardian.lint.rules.base import Hit, Rule, hit

ID = "KVG402"
_KINDS = {"call:append", "call:extend", "call:add", "call:insert", "call:appendleft", "call:extendleft",
          "call:setdefault", "call:update", "setitem"}


def unbounded_state(ix: ModuleIndex, s: Store) -> bool:
    """Is the store's target a module/class container that nothing bounds or empties?"""
    c = ix.containers.get(s.target)
    if c is None or c.bounded or s.target in ix.instance_attrs or s.target in ix.removed:
        return False
    attr = s.target.split(".", 1)[1] if "." in s.target else None
    return not (attr and f"*.{attr}" in ix.removed)


def check(ix: ModuleIndex) -> Iterator[Hit]:
    for s in ix.stores:
        if s.kind not in _KINDS or s.function is None or s.value is None:
            continue
        if not unbounded_state(ix, s):
            continue
        if N.is_cache_expr(s.value, s.function.kv_names):
            where = "class" if "." in s.target else "module"
            yield hit(s.node, f"per-request KV or generate() output stored into {where}-level '{s.target}' "
                              "(nothing in this module bounds or empties it): every request's cache stays alive; "
                              "keep it in the request's scope or bound the container")


RULE = Rule(ID, "python", check, __doc__ or "")
