"""``kv-guardian report --redact``: a report written without ``--redact`` is shown as if it had been written
with it. What is hidden is what the producers hide:

- KV reports (``run --redact``, ``Guard(redact=True)``): the dictionary keys in holder chains. A key is shown as
  ``<str len=N>`` or ``<key>`` exactly as the holder-chain search writes it with ``redact=True``, wherever a
  ``dict[...]`` step appears (chains, messages, evidence).
- Redis scans and diffs (``redis scan --redact``): key-name literals in patterns and key names become the same
  stable hashes (`kvguardian.keyspace.redact.Redactor`); the findings keep their messages with every name that
  was redacted replaced by its hash.

Reports never contain KV contents or prompt text in the first place; redaction is about names.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from kvguardian.keyspace.redact import Redactor, redact_value
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


class _Names(Redactor):
    """A `Redactor` that remembers each name it redacted (to find them again in free text)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, str] = {}

    def pattern(self, pattern: str) -> str:
        out = super().pattern(pattern)
        self.seen[pattern] = out
        return out

    def key(self, key: str | None) -> str | None:
        out = super().key(key)
        if key is not None and out is not None:
            self.seen[key] = out
        return out


def _replace_names(data: Any, names: dict[str, str], pattern: re.Pattern[str]) -> Any:
    if isinstance(data, str):
        return pattern.sub(lambda m: names[m.group(0)], data)
    if isinstance(data, dict):
        return {k: _replace_names(v, names, pattern) for k, v in data.items()}
    if isinstance(data, list):
        return [_replace_names(v, names, pattern) for v in data]
    return data


def _redact_keyspace(data: dict[str, Any]) -> dict[str, Any]:
    names = _Names()
    out: dict[str, Any] = redact_value(names, "", data)
    seen = {k: v for k, v in names.seen.items() if k and k != v}
    if seen:
        alternatives = "|".join(re.escape(k) for k in sorted(seen, key=len, reverse=True))
        out = _replace_names(out, seen, re.compile(alternatives))
    if data.get("schema") == "kv-guardian/redis-scan":
        out["redacted"] = True
    return out


def _is_keyspace(data: Any) -> bool:
    return isinstance(data, dict) and (data.get("schema") == "kv-guardian/redis-scan" or "rows" in data)


def redact_data(data: Any) -> Any:
    """A copy of report JSON ``data`` as the producer's ``--redact`` would have written it."""
    if _is_keyspace(data):
        return data if data.get("redacted") else _redact_keyspace(data)
    return _redact_chains(data)


def _redact_chains(data: Any) -> Any:
    """Every string passed through `redact_text` (keys of objects too)."""
    if isinstance(data, str):
        return redact_text(data)
    if isinstance(data, dict):
        return {redact_text(k) if isinstance(k, str) else k: _redact_chains(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_redact_chains(v) for v in data]
    return data
