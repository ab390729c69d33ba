"""Data from outside (key names, label values, server replies, paths, exception texts) made safe to show.

Nothing kv-guardian prints is parsed as markup, and no character that moves the cursor, rewrites the screen or
reorders text reaches a terminal raw: `visible` writes control, bidi and zero-width characters as escapes,
`dumps` is `json.dumps` with the same characters as ``\\uXXXX`` and non-finite floats as ``null``. Both mask every
credential seen (`kvguardian.core.report.secrets`). Details: docs/design/report.md.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from kvguardian.core.findings import json_default
from kvguardian.core.report.secrets import has_secrets, mask

__all__ = ["UNSAFE", "dumps", "visible"]

#: Characters never written raw to a terminal or a JSON document we print.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")

# json.dumps already escapes C0 characters inside strings; raw newlines in its output are indentation
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object) -> str:
    """``str(text)`` with credentials masked and every `UNSAFE` character written as a visible escape
    (``\\x1b``, ``\\n``, ``\\u202e``)."""
    s = text if isinstance(text, str) else str(text)
    return UNSAFE.sub(_escape, mask(s))


def _clean(obj: object, masking: bool) -> Any:
    """A copy of ``obj`` for JSON: NaN and ±inf as None (JSON has no such numbers), and, when ``masking``,
    every credential in a string (keys included) masked."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, str):
        return mask(obj) if masking else obj
    if isinstance(obj, dict):
        return {_clean(k, masking) if isinstance(k, str) else k: _clean(v, masking) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v, masking) for v in obj]
    return obj


def dumps(obj: object, *, indent: int | None = 2, default: Callable[[Any], Any] | None = json_default) -> str:
    """JSON text of ``obj``: UTF-8 kept readable, `UNSAFE` characters as ``\\uXXXX``, NaN/inf as null,
    credentials masked (in the values, before encoding: the JSON stays valid whatever the password)."""
    masking = has_secrets()

    def clean_default(o: object) -> Any:
        return _clean(default(o), masking) if default is not None else o

    if masking:
        obj = _clean(obj, masking)
    try:
        text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False,
                          default=clean_default if masking else default)
    except ValueError:  # a NaN or an infinity somewhere
        text = json.dumps(_clean(obj, masking), indent=indent, ensure_ascii=False, allow_nan=False,
                          default=clean_default)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
