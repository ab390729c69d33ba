"""``kv-guardian report --redact`` for KV reports: a report written without ``--redact`` shown as if it had been
written with it (``run --redact``, ``Guard(redact=True)``): the dictionary keys in holder chains are hidden. A key
is shown as ``<str len=N>`` or ``<key>`` exactly as the holder-chain search writes it with ``redact=True``,
wherever a ``dict[...]`` step appears (chains, messages, evidence). Redis scans and diffs are redacted by
`kvguardian.keyspace.redact.redact_keyspace_json` (the command picks one: `kvguardian.apps.cli.report`).

Reports never contain KV contents or prompt text in the first place; redaction is about names.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from kvguardian.core.tensors.holders.edges import key_repr

__all__ = ["redact_chains", "redact_text"]

_STEP = re.compile(r"dict\[((?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\[\]'\"])*)\]")


def _step(match: re.Match[str]) -> str:
    inner = match.group(1)
    if inner.startswith("<class"):
        return "dict[<type>]"  # a registry keyed by a class, named as the search names it unredacted
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


def redact_chains(data: object) -> Any:
    """Every string passed through `redact_text` (keys of objects too)."""
    if isinstance(data, str):
        return redact_text(data)
    if isinstance(data, dict):
        return {redact_text(k) if isinstance(k, str) else k: redact_chains(v) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_chains(v) for v in data]
    return data
