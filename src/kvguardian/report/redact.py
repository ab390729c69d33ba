"""``kv-guardian report --redact``: a report written without ``--redact`` is shown as if it had been written
with it. What is hidden is what the producers hide:

- KV reports (``run --redact``, ``Guard(redact=True)``): the dictionary keys in holder chains. A key is shown as
  ``<str len=N>`` or ``<key>`` exactly as the holder-chain search writes it with ``redact=True``, wherever a
  ``dict[...]`` step appears (chains, messages, evidence).

Reports never contain KV contents or prompt text in the first place; redaction is about names.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from kvguardian.tensors.holders.edges import key_repr

__all__ = ["redact_data", "redact_text"]

_STEP = re.compile(r"dict\[((?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\[\]'\"])*)\]")


def _step(match: re.Match[str]) -> str:
    inner = match.group(1)
    if inner.startswith("<") and inner.endswith(">"):
        return match.group(0)  # already redacted
    try:
        key = ast.literal_eval(inner)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return "dict[<key>]"
    return f"dict[{key_repr(key, True)}]"


def redact_text(text: str) -> str:
    """Every ``dict[KEY]`` step in ``text`` with its key redacted."""
    return _STEP.sub(_step, text) if "dict[" in text else text


def redact_data(data: Any) -> Any:
    """A copy of report JSON ``data`` with every string passed through `redact_text` (keys of objects too)."""
    if isinstance(data, str):
        return redact_text(data)
    if isinstance(data, dict):
        return {redact_text(k) if isinstance(k, str) else k: redact_data(v) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_data(v) for v in data]
    return data
