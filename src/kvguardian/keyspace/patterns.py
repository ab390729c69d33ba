"""Pattern mining: key names → a bounded set of patterns such as ``session:{uuid}`` or ``user:{int}:profile``.

A trie over tokens (`tokens`): variable tokens go to a placeholder child at once; literals collapse into
``{str}``/``{int}``/``{tag}`` once a node has seen more than ``collapse_after`` of one class (a namespace only past
`NAMESPACES`); past ``max_patterns`` keys go to ``{other}``. Merges are reported through ``on_merge(src, dst)``.
The hot path (`pattern_id`) is a dictionary walk. Details: docs/design/keyspace.md.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from kvguardian.core.errors import UsageError
from kvguardian.keyspace.tokens import (
    B64_MIN,
    DATE_BYTES,
    DELIMITERS,
    IP_BYTES,
    MAX_KEY_CHARS,
    TIMESTAMP_DIGITS,
    classify,
    key_str,
    literal_class,
    tokenize_ex,
)

__all__ = ["OVERFLOW", "OVERFLOW_ID", "PatternMiner"]

OVERFLOW = "{other}"
OVERFLOW_ID = 0
NAMESPACES = 100  # distinct first words kept literal (`PatternMiner.namespace_collapse_after`)


_HEXCHARS = frozenset("0123456789abcdefABCDEF")
_MASK = bytes.maketrans(b"0123456789abcdefABCDEF", b"0" * 22)
#: the coarse mask: every letter and digit to ``x`` (only the delimiters' places are left)
_COARSE = bytes.maketrans(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", b"x" * 62)
#: the characters each mask replaces (by ``all_hex``: the coarse mask's, the hex mask's)
_MASKED = {True: b"0123456789abcdefABCDEF",
           False: b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"}
#: names the coarse cache may not hold: their split can depend on more than where the delimiters are (UUIDs,
#: dates and IPs need ``-`` or ``.``, hash tags ``{``, base64 runs are long runs of these characters)
_COARSE_UNSAFE = re.compile(rb"[-.{}+/=]|[A-Za-z0-9_]{%d}" % B64_MIN)
_CACHE_MAX = 50_000  # entries per generation of a cache (two generations are kept)
_COARSE_PER_SHAPE = 4  # patterns one coarse mask may stand for

Check = Callable[[bytes], bool]


def _class_check(want: str, tok: str, all_hex: bool) -> Check:
    """A test that a token in the place of ``tok`` classifies as ``want`` (`_checks`). ``all_hex``: the
    mask cache's guarantee, the token has a hex digit where ``tok`` has one and ``tok``'s other characters
    where it has them (so a date keeps its ``-`` at 4, an IP its dots and no ``-``: `classify` then only
    has its regex left to try)."""
    width = len(tok)
    ts = _TS.get(width)
    if all_hex and want == "date" and tok[4:5] == "-":
        return lambda t: DATE_BYTES.fullmatch(t) is not None
    if all_hex and want == "ip" and "." in tok and "-" not in tok:
        return lambda t: IP_BYTES.fullmatch(t) is not None
    if want == "~int" and width not in _TS_OR_DATE_LENGTHS:
        return bytes.isdigit  # what classify + literal_class give for such a digit run, without the calls
    if ts is not None and want == ts[0] and width != 10:  # 10 digits: yyyymmddhh is a date (classify)
        lo, hi = ts[1], ts[2]
        return lambda tok: tok.isdigit() and lo <= int(tok) < hi  # classify's timestamp rule
    if want == "hex" and all_hex and width >= 8:  # classify: ≥ 8 hex digits, not all digits, not all letters
        return lambda tok: not tok.isdigit() and not tok.isalpha()
    return lambda tok: _token_class(tok) == want


def _checks(toks: list[str], labels: list[str], *, all_hex: bool = True) -> tuple[tuple[int, int, bytes | Check], ...]:
    """What a cached mask must verify: literal runs (bytes to compare) and, for every placeholder but
    ``{uuid}``, a test that the token classifies as the placeholder's class (``ts_ns``; ``~int`` for a
    collapsed literal), see `_class_check`. A literal run the mask keeps byte for byte (``:`` between two
    placeholders, ``:hits:``: no character the mask replaces) needs no compare: equal masks have it."""
    out: list[tuple[int, int, bytes | Check]] = []
    joined = "".join(toks).encode("ascii")
    masked = _MASKED[all_hex]

    def literal(start: int, end: int) -> None:
        run = joined[start:end]
        if run.translate(None, masked) != run:  # it holds a character the mask replaces
            out.append((start, end, run))

    pos = 0
    run_start = -1
    for tok, label in zip(toks, labels):
        end = pos + len(tok)
        if tok == label:  # literal: extend the current literal run
            if run_start < 0:
                run_start = pos
        else:
            if run_start >= 0:
                literal(run_start, pos)
                run_start = -1
            if label != "{uuid}":
                cls = label[1:-1]
                want = "~" + cls if cls in ("int", "str", "tag") else cls
                out.append((pos, end, _class_check(want, tok, all_hex)))
        pos = end
    if run_start >= 0:
        literal(run_start, pos)
    return tuple(out)


_TS_OR_DATE_LENGTHS = frozenset((8, 10, 12, 13, 14, 16, 19))  # digit runs `classify` may call a date or timestamp
_TS = TIMESTAMP_DIGITS


@functools.lru_cache(maxsize=1024)
def _token_class(tok: bytes) -> str:
    """What a class check compares with: the variable class of an ASCII token (`classify`), or ``~`` and its
    literal class. Memoized (bounded): the entries of one coarse shape (``job:{int}:{rand}``, ``{str}``,
    ``{hex}``) test the same token against their classes one after the other."""
    text = tok.decode("ascii")
    cls = classify(text)
    return cls if cls is not None else "~" + literal_class(text)


def _is_literal(label: str) -> bool:
    """A word/int/tag label (not a delimiter, not the cut marker)."""
    return label not in DELIMITERS and label != "…"


_Entry = tuple[int, tuple[tuple[int, int, "bytes | Check"], ...]]  # (pattern id, checks)


def _verify(raw: bytes, checks: tuple[tuple[int, int, bytes | Check], ...]) -> bool:
    """Every check of a cache entry holds for ``raw``."""
    for s, e, want in checks:
        if want.__class__ is bytes:
            if raw[s:e] != want:
                return False
        elif not want(raw[s:e]):  # type: ignore[operator]
            return False
    return True


class _Node:
    """One trie node. ``lit``: literal token → child; ``var``: placeholder → child."""

    __slots__ = ("counts", "hexw", "lit", "pid", "var", "wild")

    def __init__(self) -> None:
        self.lit: dict[str, _Node] = {}
        self.var: dict[str, _Node] = {}
        self.counts: dict[str, int] = {}  # literal class → distinct literal children of that class
        self.wild: set[str] = set()  # literal classes collapsed into a placeholder at this node
        self.pid = -1  # pattern id of keys that end here, -1 if none yet
        self.hexw: set[int] | None = None  # widths of the {hex} tokens seen here (None: no {hex} child)


class PatternMiner:
    """Assigns each key name a pattern id; ids are dense ints, `OVERFLOW_ID` is ``{other}``.

    Args:
        max_patterns: cap on live patterns (the overflow pattern not included).
        collapse_after: distinct literals of one class at one position before they become a placeholder.
        on_merge: called as ``on_merge(src_pid, dst_pid)`` when a collapse merges two patterns.
    Raises:
        UsageError: for a cap or threshold below 1.
    """

    def __init__(self, *, max_patterns: int = 500, collapse_after: int = 20,
                 on_merge: Callable[[int, int], None] | None = None) -> None:
        if max_patterns < 1 or collapse_after < 1:
            raise UsageError(f"max_patterns ({max_patterns}) and collapse_after ({collapse_after}) must be ≥ 1")
        self.max_patterns = max_patterns
        self.collapse_after = collapse_after
        # the first word of a name is nearly always its namespace (``session:…``, ``cart:…``): an application
        # has dozens of them, so that position collapses into ``{str}`` only past this many
        self.namespace_collapse_after = max(collapse_after, NAMESPACES)
        self.on_merge = on_merge
        self._root = _Node()
        self._names: list[str] = [OVERFLOW]  # pid → pattern string ('' once merged away)
        self._alive = 0
        self._nodes = 1
        self._max_nodes = 64 * max_patterns + 1024
        self._classes: dict[str, str | None] = {}  # memo of classify for literal tokens (bounded)
        self._cache: dict[bytes, _Entry] = {}  # mask → entry (this generation)
        self._old: dict[bytes, _Entry] = {}  # the previous generation: hits move back into _cache
        self._coarse: dict[bytes, list[_Entry]] = {}  # coarse mask → entries, for names with no UUID/date/IP/…

    # -- hot path -----------------------------------------------------------------------------------------
    def pattern_id(self, name: str) -> int:
        """The pattern id of one key name (creates the pattern on first sight)."""
        return self._mine(name)[0]

    def pattern_id_bytes(self, raw: bytes) -> int:
        """The pattern id of a key name as Redis returns it (bytes), through the shape caches.

        Names with equal masks (hex characters → ``0``, or for simple names letters and digits → ``x``) split into the
        same tokens, so a cached entry for the mask gives the pattern once its literal parts match; anything else takes
        the full path. Each cache keeps two bounded generations and is cleared on every merge. Details:
        docs/design/keyspace.md."""
        return self._pattern_id_masked(raw, raw.translate(_MASK))

    def _pattern_id_masked(self, raw: bytes, mask: bytes) -> int:
        entry = self._cache.get(mask)
        if entry is None:
            entry = self._old.get(mask)
            if entry is not None:
                self._cache[mask] = entry
        if entry is not None and _verify(raw, entry[1]):
            return entry[0]
        coarse = raw.translate(_COARSE)
        centries = self._coarse.get(coarse, ())
        for i, centry in enumerate(centries):  # a shape can hold a few patterns: job:{int}:{rand}, {hex}, ...
            if _verify(raw, centry[1]):
                if i:  # the most frequent first: each failed check may have cost a classify
                    centries[i - 1], centries[i] = centry, centries[i - 1]  # type: ignore[index]
                return centry[0]
        name = key_str(raw)
        pid, toks, labels, content_dependent = self._mine(name)
        if (pid != OVERFLOW_ID and not content_dependent and raw.isascii() and b"\\" not in raw  # text == raw
                and len(raw) <= MAX_KEY_CHARS
                and len(labels) == len(toks) and toks[-1:] != ["…"]):
            self._remember(mask, (pid, _checks(toks, labels)))
            if len(centries) < _COARSE_PER_SHAPE and len(self._coarse) < _CACHE_MAX and not _COARSE_UNSAFE.search(raw):
                self._coarse.setdefault(coarse, []).append((pid, _checks(toks, labels, all_hex=False)))
        return pid

    def _remember(self, mask: bytes, entry: _Entry) -> None:
        if len(self._cache) >= _CACHE_MAX:
            self._old, self._cache = self._cache, {}
        self._cache[mask] = entry

    def _forget(self) -> None:
        self._cache.clear()
        self._old.clear()
        self._coarse.clear()

    def pattern_ids_bytes(self, raws: list[bytes]) -> list[int]:
        """`pattern_id_bytes` for a batch: the mask-cache hit path inlined (a scan calls this once per batch)."""
        cache_get = self._cache.get
        mask_table = _MASK
        out: list[int] = []
        append = out.append
        slow = self._pattern_id_masked
        for raw in raws:
            mask = raw.translate(mask_table)
            entry = cache_get(mask)
            if entry is not None:
                for s, e, want in entry[1]:
                    if want.__class__ is bytes:
                        if raw[s:e] != want:
                            break
                    elif not want(raw[s:e]):  # type: ignore[operator]
                        break
                else:
                    append(entry[0])
                    continue
            append(slow(raw, mask))
            cache_get = self._cache.get  # a new generation or a merge may have replaced the dict
        return out

    def _mine(self, name: str) -> tuple[int, list[str], list[str], bool]:
        node = self._root
        labels: list[str] = []
        toks, content_dependent = tokenize_ex(name)
        for tok in toks:
            child = node.lit.get(tok)
            if child is not None:
                labels.append(tok)
                node = child
                continue
            child, label = self._step(node, tok)
            if child is None:
                return OVERFLOW_ID, toks, labels, content_dependent
            labels.append(label)
            node = child
        pid = node.pid
        if pid < 0:
            pid = self._new_pattern(node, labels)
        return pid, toks, labels, content_dependent

    def _step(self, node: _Node, tok: str) -> tuple[_Node | None, str]:
        """Follow (or create) the child for a token the node has no literal child for."""
        if not _is_literal(tok):
            cls = None
        else:
            cls = self._classes.get(tok, "?")
            if cls == "?":
                cls = classify(tok)
                if cls is None and len(self._classes) < 100_000:
                    self._classes[tok] = None  # only literals repeat; variable tokens are unique
        if cls != "hex" and node.hexw is not None and len(tok) in node.hexw and _is_literal(tok) \
                and _HEXCHARS.issuperset(tok):
            cls = "hex"  # a hex value that happens to be all digits (or all letters) where hex values of its width go
        if cls is not None:
            label = "{" + cls + "}"
            child = node.var.get(label)
            if child is None:
                child = self._new_node(node.var, label)
            if cls == "hex" and child is not None and (node.hexw is None or len(tok) not in node.hexw):
                self._hex_width(node, child, len(tok))
            return child, label
        if not _is_literal(tok):
            return self._new_node(node.lit, tok), tok
        lcls = literal_class(tok)
        if lcls in node.wild:
            label = "{" + lcls + "}"
            child = node.var.get(label)
            if child is None:
                child = self._new_node(node.var, label)
            return child, label
        n = node.counts.get(lcls, 0) + 1
        node.counts[lcls] = n
        if n > (self.namespace_collapse_after if node is self._root and lcls == "str" else self.collapse_after):
            self._collapse(node, lcls)
            label = "{" + lcls + "}"
            return node.var[label], label
        return self._new_node(node.lit, tok), tok

    def _new_node(self, table: dict[str, _Node], label: str) -> _Node | None:
        if self._nodes >= self._max_nodes:
            return None
        self._nodes += 1
        child = table[label] = _Node()
        return child

    def _new_pattern(self, node: _Node, path: list[str]) -> int:
        if self._alive >= self.max_patterns:
            return OVERFLOW_ID
        node.pid = len(self._names)
        self._names.append("".join(path))
        self._alive += 1
        return node.pid

    def _hex_width(self, node: _Node, hex_child: _Node, width: int) -> None:
        """Hex values of ``width`` characters go to ``node``'s ``{hex}`` child from now on, also those that happen
        to be all digits or all letters (a random 8-digit hex value is all digits 2.3 % of the time, a 16-digit
        one 0.05 %: ``k:{hex}`` would otherwise sprout ``k:{int}``, ``k:{date}``, ``k:{ts_us}`` and literals).
        Literal children of that width made of hex characters (seen before the first hex value) are merged in;
        the shape caches are cleared, since names they route elsewhere now go here."""
        if node.hexw is None:
            node.hexw = set()
        node.hexw.add(width)
        absorbed = [t for t in node.lit if len(t) == width and _is_literal(t) and _HEXCHARS.issuperset(t)]
        for tok in absorbed:
            lc = literal_class(tok)
            node.counts[lc] = node.counts.get(lc, 1) - 1
            self._merge(node.lit.pop(tok), hex_child)
        self._forget()
        if absorbed:
            self._rename(self._root, [])

    # -- collapse -----------------------------------------------------------------------------------------
    def _collapse(self, node: _Node, lcls: str) -> None:
        """Merge every literal child of class ``lcls`` into the placeholder child ``{lcls}``; rename patterns."""
        self._collapse_at(node, lcls)
        self._rename(self._root, [])

    def _collapse_at(self, node: _Node, lcls: str) -> None:
        label = "{" + lcls + "}"
        node.wild.add(lcls)
        target = node.var.get(label)
        if target is None:
            target = node.var[label] = _Node()
            self._nodes += 1
        for tok in [t for t in node.lit if _is_literal(t) and literal_class(t) == lcls]:
            self._merge(node.lit.pop(tok), target)

    def _merge(self, src: _Node, dst: _Node) -> None:
        """Merge the trie ``src`` into ``dst`` (children, collapsed classes, pattern ids); ``src`` is dropped."""
        self._nodes -= 1
        if src.pid >= 0:
            if dst.pid < 0:
                dst.pid = src.pid
            else:
                self._names[src.pid] = ""
                self._alive -= 1
                self._forget()
                if self.on_merge is not None:
                    self.on_merge(src.pid, dst.pid)
        newly_wild = src.wild - dst.wild
        dst.wild |= src.wild
        for label, child in src.var.items():
            self._attach(dst.var, label, child)
        for label, child in src.lit.items():
            if _is_literal(label) and literal_class(label) in dst.wild:
                self._attach(dst.var, "{" + literal_class(label) + "}", child)
            elif label in dst.lit:
                self._merge(child, dst.lit[label])
            else:
                dst.lit[label] = child
                if _is_literal(label):
                    lc = literal_class(label)
                    dst.counts[lc] = dst.counts.get(lc, 0) + 1
        for lc in newly_wild:  # dst's own literals of a class src had collapsed: into the placeholder too, so
            self._collapse_at(dst, lc)  # the trie does not depend on which of the two saw its names first
        for lc, n in list(dst.counts.items()):  # the merged node may now exceed the threshold itself
            if n > self.collapse_after and lc not in dst.wild:
                self._collapse_at(dst, lc)

    def _attach(self, table: dict[str, _Node], label: str, child: _Node) -> None:
        if label in table:
            self._merge(child, table[label])
        else:
            table[label] = child

    def _rename(self, node: _Node, path: list[str]) -> None:
        """Recompute pattern strings after a collapse changed the labels on some paths."""
        if node.pid >= 0 and self._names[node.pid]:
            self._names[node.pid] = "".join(path)
        for table in (node.lit, node.var):
            for label, child in table.items():
                path.append(label)
                self._rename(child, path)
                path.pop()

    # -- results ------------------------------------------------------------------------------------------
    def name(self, pid: int) -> str:
        """The pattern string of a live id (``''`` for an id merged away)."""
        return self._names[pid]

    def patterns(self) -> dict[int, str]:
        """Live pattern ids → pattern strings (the overflow pattern included)."""
        return {pid: n for pid, n in enumerate(self._names) if n}

    @property
    def size(self) -> int:
        """Number of pattern ids handed out so far (dead ones included): arrays indexed by pid need this."""
        return len(self._names)

    @property
    def live(self) -> int:
        return self._alive

    def check_invariants(self) -> None:
        """Every live pid is reachable from exactly one trie leaf; node count matches the trie."""
        seen: dict[int, int] = {}
        count = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            count += 1
            if node.pid >= 0:
                seen[node.pid] = seen.get(node.pid, 0) + 1
            stack.extend(node.lit.values())
            stack.extend(node.var.values())
        live = {pid for pid, n in enumerate(self._names) if n and pid != OVERFLOW_ID}
        if set(seen) != live or any(v != 1 for v in seen.values()):
            raise AssertionError(f"pattern trie corrupt: leaves {sorted(seen)} vs live ids {sorted(live)}")
        if count != self._nodes or self._alive != len(live):
            raise AssertionError(f"pattern trie counts corrupt: {count} nodes vs {self._nodes}, "
                                 f"{len(live)} live vs {self._alive}")
