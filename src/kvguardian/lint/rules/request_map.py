"""KVG407 request-map-no-removal: a per-request map on a long-lived object that is never emptied.

The shape of lost frees in real schedulers (vLLM #46283). Fires on ``self.X[<request id>] = ...`` (or
``setdefault``) when nothing in the module removes from any ``.X``, ``X`` is a dict or list made in this module,
and the class is neither a temporary nor per-request by name (Request, Sequence, State...).

Fix: remove the entry on every exit path of a request, ideally in one ``free``/``finish`` method.

False positives: removal through a local alias or from another module. The exact rules: docs/design/lint.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kvguardian.lint.python import names as N
from kvguardian.lint.python.index import ModuleIndex
from kvguardian.lint.rules.base import Hit, Rule, describe, hit

ID = "KVG407"
_PER_REQUEST_CLASS = re.compile(r"Request|Sequence|Seq|Group|Output|State|Stats|Metrics|Batch|Context|Req|"
                                r"Metadata|Meta|Info|Plan|Step", re.IGNORECASE)


def check(ix: ModuleIndex) -> Iterator[Hit]:
    reported: set[str] = set()
    for s in ix.stores:
        if s.kind not in ("setitem", "call:setdefault") or s.key is None or s.function is None:
            continue
        if not N.is_request_id(s.key) or "." not in s.target or s.target.startswith("*."):
            continue
        cls, attr = s.target.split(".", 1)
        if _PER_REQUEST_CLASS.search(cls) or s.target in ix.removed or f"*.{attr}" in ix.removed:
            continue
        if s.target not in ix.instance_containers and s.target not in ix.containers:
            continue  # a tensor/array, or defined by a base class elsewhere (which may remove its entries)
        if cls in ix.temporary_classes and cls not in ix.kept_classes:
            continue  # only ever built as `Cls(...).method(...)`: the map dies with the call
        if s.target in reported:
            continue
        reported.add(s.target)
        yield hit(s.node, f"'{s.target}' is filled per request (key {describe(s.key, 40)}) and nothing in this "
                          "module removes an entry: every request's entry outlives it; pop it on every exit path")


RULE = Rule(ID, "python", check, __doc__ or "")
