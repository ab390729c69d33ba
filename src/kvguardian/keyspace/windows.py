"""Time windows in key names: an integer that counts minutes, hours or days since 1970 (``rate:{ip}:{int}``
with ``int(time.time() // 60)``). Such a key is written for one window and never again: without a TTL every
window leaves its keys behind, which is KVG302's case (a new key per write, forever), not KVG305's.

A window is told from an id by its values: all of them a whole number of windows since 1970 within a year
before the scan. They are either the values of one ``{int}`` (the pattern's example and largest keys), or, while
the windows are few and the miner keeps each as a literal (``rate:{ip}:29940294``, ``rate:{ip}:29940295``), the
literals of sibling patterns that differ only there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvguardian.keyspace.tokens import tokenize

__all__ = ["WINDOWS", "time_window", "windowed_patterns"]

#: window name -> seconds, the shortest first (a value near now in minutes is far from now in hours)
WINDOWS = (("minute", 60), ("hour", 3600), ("day", 86400))
_BEFORE = 366 * 86400  # how far before the scan a window may lie (an RDB snapshot a year old included)
_AFTER = 86400  # clocks and time zones: a window up to a day ahead
_MIN_VALUES = {"minute": 2, "hour": 2, "day": 3}  # distinct values needed (days: 5-digit ids are common)


def time_window(row: Mapping[str, Any], at: float) -> str | None:
    """The window (``"minute"``, ``"hour"``, ``"day"``) one ``{int}`` of the pattern ``row`` counts, seen at Unix
    time ``at``, or None."""
    pattern = tokenize(str(row.get("pattern", "")))
    slots = [i for i, t in enumerate(pattern) if t == "{int}"]
    if not slots:
        return None
    values: dict[int, set[int]] = {i: set() for i in slots}
    for key in _sample_keys(row):
        toks = tokenize(key)
        if len(toks) != len(pattern):
            continue
        for i in slots:
            if toks[i].isdigit() and len(toks[i]) <= 12:
                values[i].add(int(toks[i]))
    for found in values.values():
        name = _window_of(found, at)
        if name is not None:
            return name
    return None


def windowed_patterns(rows: Iterable[Mapping[str, Any]], at: float) -> dict[str, str]:
    """pattern -> window for every pattern of ``rows`` whose name counts time windows: through an ``{int}``
    (`time_window`), or through a literal its siblings vary (``rate:{ip}:29940294`` and ``...:29940295``)."""
    out: dict[str, str] = {}
    siblings: dict[tuple[str, ...], dict[int, str]] = {}  # the name with {int} at one literal -> value -> pattern
    for row in rows:
        pattern = str(row.get("pattern", ""))
        name = time_window(row, at)
        if name is not None:
            out[pattern] = name
        toks = tokenize(pattern)
        for i, tok in enumerate(toks):
            if tok.isdigit() and len(tok) <= 12 and _window_of({int(tok)}, at, need=1) is not None:
                siblings.setdefault((*toks[:i], "{int}", *toks[i + 1:]), {})[int(tok)] = pattern
    for members in siblings.values():
        name = _window_of(set(members), at)
        if name is not None:
            for pattern in members.values():
                out.setdefault(pattern, name)
    return out


def _window_of(values: set[int], at: float, need: int | None = None) -> str | None:
    """The shortest window in which every one of ``values`` lies near ``at``, with enough distinct values."""
    for name, size in WINDOWS:
        lo, hi = (at - _BEFORE) / size, (at + _AFTER) / size
        if len(values) >= (_MIN_VALUES[name] if need is None else need) and all(lo <= v <= hi for v in values):
            return name
    return None


def _sample_keys(row: Mapping[str, Any]) -> Iterable[str]:
    for name in ("example_key", "example_no_ttl_key", "example_cold_key"):
        if isinstance(row.get(name), str):
            yield row[name]
    for top in row.get("top_keys") or []:
        if isinstance(top, Mapping) and isinstance(top.get("key"), str):
            yield top["key"]
