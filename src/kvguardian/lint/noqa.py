"""``# noqa`` comments: ``# noqa`` alone silences every rule on its line, ``# noqa: KVG401, KVG405`` those ids.

Go, Java and Kotlin use ``// noqa: KVG405``. A diagnostic is silenced by a comment on its first line or on the
last line of the statement it points at (where formatters move trailing comments).
"""

from __future__ import annotations

import re

__all__ = ["NoqaMap", "parse_noqa"]

_NOQA = re.compile(r"(?:#|//)\s*noqa(?::\s*(?P<codes>[A-Za-z]+\d+(?:[\s,]+[A-Za-z]+\d+)*))?", re.IGNORECASE)
_CODE = re.compile(r"[A-Za-z]+\d+")

#: line number -> None (every rule) or the set of ids silenced there
NoqaMap = dict[int, "frozenset[str] | None"]


def parse_noqa(text: str) -> NoqaMap:
    """Every line with a noqa comment. Cheap when there is none (one substring search)."""
    out: NoqaMap = {}
    if "noqa" not in text and "NOQA" not in text:
        return out
    for lineno, line in enumerate(text.splitlines(), 1):
        if "noqa" not in line.lower():
            continue
        m = _NOQA.search(line)
        if m is None:
            continue
        codes = m.group("codes")
        out[lineno] = frozenset(c.upper() for c in _CODE.findall(codes)) if codes else None
    return out


def silenced(noqa: NoqaMap, rule: str, *lines: int) -> bool:
    """True when a noqa comment on any of ``lines`` covers ``rule``."""
    for line in lines:
        if line in noqa:
            codes = noqa[line]
            if codes is None or rule in codes:
                return True
    return False
