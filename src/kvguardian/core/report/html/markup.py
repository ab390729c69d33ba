"""The one place where data becomes HTML or SVG text.

Everything shown in a report comes from outside kv-guardian (request ids, key names, holder-chain steps,
exception texts). `text` is the only way data enters the page: control, bidi and zero-width characters are
written as visible escapes (``\\x1b``, ``\\u202e``) as on the terminal, lone surrogates too, credentials are
masked, and ``<&>"'`` become entities, so a
request id ``<script>alert(1)</script>`` is shown as those characters and never parsed. `el` builds an element
from already-safe content and escaped attributes; nothing else in the package writes ``<`` itself except the
fixed markup of the page shell.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable

from kvguardian.core.report.escape import visible

__all__ = ["attrs", "el", "join", "num", "text", "truncate"]

_SURROGATE = re.compile("[\ud800-\udfff]")  # lone surrogates (JSON allows them; UTF-8 cannot encode them)


def text(value: object) -> str:
    """``str(value)`` as HTML text (also safe inside a quoted attribute): credentials masked and unsafe
    characters as visible escapes (`kvguardian.core.report.escape.visible`), lone surrogates as ``\\udXXX``, markup
    characters as entities."""
    shown = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", visible(value))
    return html.escape(shown, quote=True)


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
