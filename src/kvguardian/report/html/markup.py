"""The one place where data becomes HTML or SVG text.

Everything shown in a report comes from outside kv-guardian (request ids, key names, holder-chain steps,
exception texts). `text` is the only way data enters the page: control, bidi and zero-width characters are
written as visible escapes (``\\x1b``, ``\\u202e``), lone surrogates too, and ``<&>"'`` become entities, so a
request id ``<script>alert(1)</script>`` is shown as those characters and never parsed. `el` builds an element
from already-safe content and escaped attributes; nothing else in the package writes ``<`` itself except the
fixed markup of the page shell.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable

__all__ = ["attrs", "el", "join", "num", "text", "truncate"]

# C0/C1 controls, DEL, bidi overrides/isolates, line/paragraph separators, zero-width space, BOM, surrogates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff"
                     "\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def text(value: object) -> str:
    """``str(value)`` as HTML text (also safe inside a quoted attribute): unsafe characters as visible escapes,
    markup characters as entities."""
    s = value if isinstance(value, str) else str(value)
    return html.escape(_UNSAFE.sub(_escape, s), quote=True)


def truncate(value: object, limit: int) -> str:
    """``str(value)`` cut to ``limit`` characters with an ellipsis (plain text: pass it through `text`)."""
    s = value if isinstance(value, str) else str(value)
    return s if len(s) <= limit else s[: max(1, limit - 1)] + "…"


def num(value: float, digits: int = 1) -> str:
    """A coordinate or measure for SVG: short, no exponent, no trailing zeros."""
    s = f"{value:.{digits}f}"
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def attrs(items: dict[str, object]) -> str:
    """`` name="value"`` pairs (values escaped); None and False are left out, True is a bare attribute.
    A trailing underscore is dropped from a name (``class_``) and other underscores become dashes."""
    out = []
    for name, value in items.items():
        if value is None or value is False:
            continue
        key = name.rstrip("_").replace("_", "-")
        if value is True:
            out.append(f" {key}")
        else:
            out.append(f' {key}="{text(value)}"')
    return "".join(out)


def el(tag: str, content: str = "", /, **attributes: object) -> str:
    """``<tag attributes>content</tag>``; ``content`` must already be markup (use `text` for data)."""
    return f"<{tag}{attrs(attributes)}>{content}</{tag}>"


def join(parts: Iterable[str]) -> str:
    return "".join(parts)
