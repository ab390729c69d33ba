"""Referrers known without a heap scan: when every reference to an object is accounted for.

A heap scan is costly, and many frontier objects are held only by other frontier objects. `held_within` picks
those, the scan asks only about the rest, and `fully_accounted` proves by ``sys.getrefcount`` that the picked
ones have no other referrer. A reference the collector cannot show leaves the count short, so the caller
scans after all: never a wrong answer, only a scan not saved. Details: docs/design/tensors.md.
"""

from __future__ import annotations

import gc
import sys
from collections import Counter
from typing import Any

__all__ = ["frontier_holders", "fully_accounted", "held_within"]

# references that only the check holds (the generator's loop variable, getrefcount's argument: 2 in CPython
# 3.11), measured once on an object only a list holds; None where that does not come out as expected
_OWN_TEMPORARIES: int | None = None
_CALIBRATED = False


def held_within(frontier: list[Any]) -> set[int]:
    """Ids of the frontier objects that another (tracked) frontier object refers to."""
    ids = {id(o) for o in frontier}
    out: set[int] = set()
    for x in frontier:
        if gc.is_tracked(x):
            out.update(i for i in map(id, gc.get_referents(x)) if i in ids and i != id(x))
    return out


def frontier_holders(frontier: list[Any], inner: set[int], found: list[Any]) -> list[Any]:
    """The frontier objects a heap scan would return as referrers of the ``inner`` ones and ``found`` lacks:
    tracked ones that refer to an inner object (in frontier order)."""
    have = {id(r) for r in found}
    return [x for x in frontier if id(x) not in have and gc.is_tracked(x)
            and any(i in inner for i in map(id, gc.get_referents(x)))]


def fully_accounted(objs: list[Any], holders: list[Any]) -> bool:
    """Whether every reference to each of ``objs`` comes from ``holders`` (each counted once; the two lists
    themselves are counted too)."""
    own = _own_temporaries()
    return own is not None and all(d == own for d in _unaccounted(objs, _references(objs, holders)))


def _unaccounted(objs: list[Any], counts: Counter[int]) -> list[int]:
    return [sys.getrefcount(o) - counts[id(o)] for o in objs]


def _own_temporaries() -> int | None:
    global _OWN_TEMPORARIES, _CALIBRATED
    if not _CALIBRATED:
        probe = [object()]
        own = _unaccounted(probe, _references(probe, []))[0]
        _OWN_TEMPORARIES = own if 1 <= own <= 3 else None
        _CALIBRATED = True
    return _OWN_TEMPORARIES


def _references(objs: list[Any], holders: list[Any]) -> Counter[int]:
    """How many references to each of ``objs`` the ``holders`` have (and the two lists have)."""
    want = {id(o) for o in objs}
    counts: Counter[int] = Counter()
    seen: set[int] = set()
    for h in (objs, holders, *holders):
        if id(h) not in seen:
            seen.add(id(h))
            counts.update(i for i in map(id, gc.get_referents(h)) if i in want)
    return counts
