"""Split Redis key names into tokens and classify the variable ones.

Composite values (UUIDs, dates, IPv4 addresses, ``{hash tags}``, long base64 runs) are recognised before the
split at delimiters. Always-variable classes (``uuid``, timestamps, ``date``, ``ip``, ``hex``, ``b64``, ``rand``)
become placeholders at once; ``int``, words and hash tags stay literal until a position has many values.
`classify` is written for speed. The classes' exact rules: docs/design/keyspace.md.
"""

from __future__ import annotations

import itertools
import math
import re

__all__ = [
    "B64_MIN",
    "DATE_BYTES",
    "DELIMITERS",
    "IP_BYTES",
    "TIMESTAMP_DIGITS",
    "UNIQUE_CLASSES",
    "VARIABLE_CLASSES",
    "classify",
    "key_str",
    "literal_class",
    "tokenize",
    "tokenize_ex",
]

DELIMITERS = frozenset(":/.|#,;=@ _-")

#: classes that are a placeholder at first sight (their values are unique by nature)
VARIABLE_CLASSES = frozenset({"uuid", "ts_s", "ts_ms", "ts_us", "ts_ns", "date", "ip", "hex", "b64", "rand"})
#: classes whose placeholder in a no-TTL pattern means a new key per write (KVG302)
UNIQUE_CLASSES = frozenset({"uuid", "ts_s", "ts_ms", "ts_us", "ts_ns", "date", "hex", "b64", "rand"})

_HEX = r"[0-9a-fA-F]"
_UUID = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
# The tokenizer's date and IP shapes accept any hex digit where a digit goes, so the split of a name depends
# only on where its hex characters are (names with equal masks split alike, which the pattern cache relies
# on); `classify` then checks the values (``_DATE_RE``, ``_IP_RE``).
_H = "[0-9a-fA-F]"
_DATE_SHAPE = (rf"{_H}{{4}}-{_H}{{2}}-{_H}{{2}}(?:[T ]{_H}{{2}}:{_H}{{2}}(?::{_H}{{2}}(?:\.{_H}+)?)?"
               rf"(?:Z|[+-]{_H}{{2}}:?{_H}{{2}})?)?")
# An IP (and its port) ends where a token ends: ``rate:10.0.0.7:28333512`` is an ip, ``:``, then an int; a
# 5-digit "port" cut out of a longer digit run used to swallow the separator (``rate:{ip}{int}``).
_END = r"(?![0-9A-Za-z])"
_IP_SHAPE = rf"(?:{_H}{{1,3}}\.){{3}}{_H}{{1,3}}{_END}(?::{_H}{{1,5}}{_END})?"
_DATE = r"(?:19|20)\d\d-[01]\d-[0-3]\d(?:[T ][0-2]\d:[0-5]\d(?::[0-5]\d(?:\.\d+)?)?(?:Z|[+-][0-2]\d:?\d\d)?)?"
_IP = r"(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?"
_TAG = r"\{[^{}]*\}"
_WORD = r"[^:/.|#,;=@ _\-{}]+"
#: the shortest random run of the base64 alphabets kept whole (a nanoid: 21 characters, ``_`` and ``-`` included)
B64_MIN = 21
_LONG = rf"[A-Za-z0-9+/_-]{{{B64_MIN},}}={{0,2}}"

#: one findall gives the tokens in order; delimiters and stray characters come out one character each
_TOKENS = re.compile(f"{_UUID}|{_DATE_SHAPE}|{_IP_SHAPE}|{_TAG}|{_LONG}|{_WORD}|.", re.S)
_TOKENS_SHORT = re.compile(f"{_UUID}|{_DATE_SHAPE}|{_IP_SHAPE}|{_TAG}|{_WORD}|.", re.S)
_UUID_RE = re.compile(_UUID)
_DATE_RE = re.compile(_DATE)
_IP_RE = re.compile(_IP)
#: the same on bytes, for the pattern cache's checks (its names are ASCII, where \d means the same)
DATE_BYTES = re.compile(_DATE.encode())
IP_BYTES = re.compile(_IP.encode())
_HEXCHARS = frozenset("0123456789abcdefABCDEF")
_ULID_RE = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_SEGMENT_SPLIT = re.compile(r"[_/+-]+")
#: a word, camelCase word, acronym or number, optionally ending in digits (``getUserName``, ``HTTPServer``,
#: ``v2``, ``2026``): what the parts of a delimited name look like, and random parts almost never do
_WORDLIKE = re.compile(r"[A-Z]*[a-z]*(?:[A-Z][a-z]+)*\d*")

#: tokens longer than this many characters are not split further (very long key names)
MAX_KEY_CHARS = 256
MAX_TOKENS = 48

# digit-run classes by length: (class, low, high) — the range is 2001-09-09 .. 2100-01-01 in that unit
_TS = {10: ("ts_s", 10**9, 4102444800), 13: ("ts_ms", 10**12, 4102444800 * 10**3),
       16: ("ts_us", 10**15, 4102444800 * 10**6), 19: ("ts_ns", 10**18, 4102444800 * 10**9)}
TIMESTAMP_DIGITS = _TS  # the same, for the pattern cache's checks


def key_str(raw: bytes) -> str:
    """A key name (bytes, as Redis stores it) as text: UTF-8, any other byte as ``\\xNN`` and a backslash
    doubled, so the byte 0xff (``\\xff``) and the four characters ``\\xff`` (``\\\\xff``) stay two names."""
    if b"\\" in raw:
        raw = raw.replace(b"\\", b"\\\\")
    return raw.decode("utf-8", "backslashreplace")


def tokenize(name: str) -> list[str]:
    """The tokens of a key name, delimiters included, in order; ``''.join`` gives the (capped) name back.

    Names longer than `MAX_KEY_CHARS` are cut there and end with the token ``…``; so are names with more
    than `MAX_TOKENS` tokens, so a pathological name costs a bounded amount of work.
    """
    return tokenize_ex(name)[0]


def tokenize_ex(name: str) -> tuple[list[str], bool]:
    """`tokenize`, plus whether the name holds a base64 run (its split depended on the characters' values,
    not only on where the hex characters are); the pattern cache skips such names. A long run that is *not*
    base64 (``tmp_1712345678901234567``) is split at its delimiters and stays cacheable: a name with the
    same mask that would be base64 must then differ in a literal or placeholder check, or share the split."""
    cut = len(name) > MAX_KEY_CHARS
    if cut:
        name = name[:MAX_KEY_CHARS]
    toks = _TOKENS.findall(name)
    has_b64 = False
    if len(name) >= B64_MIN:
        for t in toks:
            if len(t) >= B64_MIN and not t.isalnum() and not (len(t) == 36 and t[8] == "-"):
                toks, has_b64 = _resplit(toks)
                break
    if len(toks) > MAX_TOKENS:
        toks = toks[:MAX_TOKENS]
        cut = True
    if cut:
        toks.append("…")
    return toks, has_b64


def _resplit(toks: list[str]) -> tuple[list[str], bool]:
    """Long base64-alphabet runs that are not random are split again at their delimiters."""
    out: list[str] = []
    has_b64 = False
    for t in toks:
        if len(t) >= B64_MIN and not t.isalnum():
            if _is_b64(t):
                has_b64 = True
                out.append(t)
            else:
                out.extend(_TOKENS_SHORT.findall(t))
        else:
            out.append(t)
    return out, has_b64


def _is_b64(t: str) -> bool:
    """A random run of the base64 (or base64url) alphabet: base64 of random bytes, a nanoid (21 characters).
    It mixes lower and upper case (digits or not: 2 % of 22-character base64 values have none) and switches
    often between lower case, upper case and digits: about 0.65 of neighbouring pairs in a random run, where
    camelCase and snake_case words (``CustomerSubscriptionUpdated_v2``: 0.21) stay below 0.4. Past 28
    characters a random run also has a higher entropy than words reach (4.3 bits and more against 4.1 at most).
    A run with ``_ - / +`` inside is words when every part looks like one (`_WORDLIKE`); otherwise its random
    parts need fewer switches (0.25: a nanoid has 0.35 or less one time in a hundred)."""
    body = t.rstrip("=")
    if len(body) < B64_MIN or body.upper() == body or body.lower() == body:
        return False
    entropy = _entropy(body)
    if entropy >= 4.3:  # nearly every character distinct over 28 and more: words stay near 4.1
        return True
    if len(body) < len(t) and len(t) % 4 == 0:  # "=" padding to a multiple of 4: base64 for sure
        return entropy >= 3.2 and _switch_ratio(body) >= 0.25
    segments = _SEGMENT_SPLIT.split(body)
    if all(_WORDLIKE.fullmatch(seg) for seg in segments):  # getUserNameForAccount, api/v2/userProfile
        return False
    if len(segments) > 1:  # a random run split at its _ - / +
        return entropy >= 3.3 and _switch_ratio(body) >= 0.25
    return entropy >= 3.5 and _switch_ratio(body) >= 0.4


_KIND = bytes.maketrans(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
                        b"0" * 10 + b"A" * 26 + b"a" * 26)


def _switch_ratio(body: str) -> float:
    """Share of neighbouring letter/digit pairs (delimiters skipped) whose kinds differ: lower, upper, digit."""
    kinds = body.encode("ascii", "replace").translate(_KIND, b"+/_-=")
    if len(kinds) < 2:
        return 0.0
    return sum(a != b for a, b in itertools.pairwise(kinds)) / (len(kinds) - 1)


_PLOGP: dict[int, list[float]] = {}  # n -> [c / n * log2(c / n) for c in 0..n], built on first use


def _entropy(t: str) -> float:
    """Shannon entropy of the characters, bits: the terms summed in first-occurrence order (as a `Counter`
    would give them), each looked up instead of computed (the same floats, so the same sum). The counts
    come from one pass over the characters (a ``str.count`` per distinct character costs more: its
    argument parsing dominates on short tokens)."""
    n = len(t)
    row = _PLOGP.get(n)
    if row is None:
        row = [0.0] + [c / n * math.log2(c / n) for c in range(1, n + 1)]
        if len(_PLOGP) < 512:
            _PLOGP[n] = row
    counts: dict[str, int] = {}
    get = counts.get
    for c in t:
        counts[c] = get(c, 0) + 1
    return -sum(map(row.__getitem__, counts.values()))


def literal_class(tok: str) -> str:
    """The placeholder class a literal token collapses into: ``int``, ``tag`` or ``str``."""
    if tok.isdigit():
        return "int"
    if tok[:1] == "{":
        return "tag"
    return "str"


_DIGIT_DATES = frozenset((8, 10, 12, 14))  # yyyymmdd[hh[mm[ss]]]


def _is_digit_date(tok: str) -> bool:
    """A run of digits that reads as a calendar date, with its hour, minute and second if it has them. A
    10-digit one starting with 20 is also a Unix time, of 2033-2036: read as the date (``hits:2026112619``)."""
    if tok[:2] not in ("19", "20") or not ("01" <= tok[4:6] <= "12" and "01" <= tok[6:8] <= "31"):
        return False
    return all(lim >= tok[i:i + 2] for i, lim in ((8, "23"), (10, "59"), (12, "59")) if i < len(tok))


def classify(tok: str) -> str | None:
    """The variable class of a token (``"uuid"``, ``"ts_ms"``, …), or None for a literal (word, int, tag).

    Delimiter tokens must not be passed here (the caller treats them as literals).
    """
    n = len(tok)
    if tok.isdigit():
        if n in _DIGIT_DATES and _is_digit_date(tok):
            return "date"  # yyyymmdd, yyyymmddhh (also a 10-digit timestamp's range), yyyymmddhhmm[ss]
        if n in _TS:
            cls, lo, hi = _TS[n]
            if lo <= int(tok) < hi:
                return cls
        return None
    if n == 36 and tok[8] == "-" and _UUID_RE.fullmatch(tok):
        return "uuid"
    first = tok[0]
    if first == "{":
        return None
    if first.isdigit():
        if "-" in tok and _DATE_RE.fullmatch(tok):
            return "date"
        if "." in tok and _IP_RE.fullmatch(tok):
            return "ip"
    if n >= 8 and _HEXCHARS.issuperset(tok):  # not all digits (returned above): hex if it has any digit
        return None if tok.isalpha() else "hex"
    if n >= B64_MIN and _is_b64(tok):
        return "b64"
    if n == 26 and _ULID_RE.fullmatch(tok):
        return "rand"  # a ULID: Crockford base32, upper case and digits
    if n >= 10 and _is_random(tok):
        return "rand"
    return None


_DIGIT_MARKS = bytes(49 if 48 <= i <= 57 else 48 for i in range(256))


def _is_random(tok: str) -> bool:
    """Entropy fallback: letters and digits alternate often (``a9Xk2Pq0…``), unlike words (``page10``,
    ``HTTPServerConfig``)."""
    if _WORDLIKE.fullmatch(tok):
        return False
    if tok.isascii():  # digits -> 1, the rest -> 0: count digits and digit/non-digit switches in C
        marks = tok.encode("ascii").translate(_DIGIT_MARKS)
        digits = marks.count(b"1")
        switches = marks.count(b"10") + marks.count(b"01")
    else:
        switches = digits = 0
        prev = tok[0].isdigit()
        for c in tok:
            d = c.isdigit()
            digits += d
            if d != prev:
                switches += 1
                prev = d
    if digits == 0:
        # no digits: random only if the case flips like base62 and the characters rarely repeat
        upper = sum(c.isupper() for c in tok)
        return 3 <= upper <= len(tok) - 3 and len(set(tok)) >= 0.7 * len(tok) and _entropy(tok) >= 3.3
    return switches >= 4 and _entropy(tok) >= 3.0
