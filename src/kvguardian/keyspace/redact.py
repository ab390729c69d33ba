"""``--redact``: literal parts of key names become stable hashes in every output.

A literal token (``user``, ``alice``, ``42``) becomes ``~`` and 8 hex digits of SHA-256 over an optional salt
and the token, so the same name redacts the same way in every scan (``redis diff`` still matches patterns)
while the names themselves are gone. Delimiters and placeholders (``{uuid}``) stay; in key names every
token is hashed, placeholders' values included. Set ``KVG_REDACT_SALT`` to make the hashes unguessable
from a list of likely names.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any, TypeGuard

from kvguardian.keyspace.patterns import OVERFLOW
from kvguardian.keyspace.result import ScanResult
from kvguardian.keyspace.tokens import DELIMITERS, tokenize

__all__ = ["Redactor", "is_keyspace_json", "redact_keyspace_json", "redact_result", "redact_value"]

_PLACEHOLDER = re.compile(r"\{(?:uuid|ts_s|ts_ms|ts_us|ts_ns|date|ip|hex|b64|rand|int|str|tag|other)\}")


class Redactor:
    """Stable token hashing for patterns and key names."""

    def __init__(self, salt: str | None = None) -> None:
        self.salt = (salt if salt is not None else os.environ.get("KVG_REDACT_SALT", "")).encode()
        self._memo: dict[str, str] = {}

    def token(self, tok: str) -> str:
        h = self._memo.get(tok)
        if h is None:
            h = "~" + hashlib.sha256(self.salt + tok.encode("utf-8", "surrogatepass")).hexdigest()[:8]
            if len(self._memo) < 100_000:
                self._memo[tok] = h
        return h

    def pattern(self, pattern: str) -> str:
        if pattern == OVERFLOW:
            return pattern
        out = []
        for tok in tokenize(pattern):
            out.append(tok if tok in DELIMITERS or tok == "…" or _PLACEHOLDER.fullmatch(tok) else self.token(tok))
        return "".join(out)

    def key(self, key: str | None) -> str | None:
        if key is None:
            return None
        return "".join(tok if tok in DELIMITERS or tok == "…" else self.token(tok) for tok in tokenize(key))


def redact_value(r: Redactor, k: str, v: object) -> Any:
    """``v`` (found under key ``k``) with every ``pattern`` and key-name field inside it redacted."""
    if k == "pattern" and isinstance(v, str):
        return r.pattern(v)
    if k in ("key", "example_key", "example_cold_key", "example_no_ttl_key") and (v is None or isinstance(v, str)):
        return r.key(v)
    if isinstance(v, dict):
        return {kk: redact_value(r, kk, vv) for kk, vv in v.items()}
    if isinstance(v, list):
        return [redact_value(r, k, x) for x in v]
    return v


def redact_result(result: ScanResult, redactor: Redactor | None = None) -> ScanResult:
    """A copy of ``result`` with every pattern and key name redacted and no findings: build the findings
    from the copy (`verdicts.scan_findings`) so their messages only ever see redacted names."""
    r = redactor or Redactor()
    out = ScanResult.from_dict(result.to_dict())
    out.patterns = [redact_value(r, "", p) for p in out.patterns]
    out.findings = []
    out.redacted = True
    return out


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


def is_keyspace_json(data: object) -> TypeGuard[dict[str, Any]]:
    """Whether report JSON ``data`` is a Redis scan (``redis scan --json``) or diff (``redis diff --json``)."""
    return isinstance(data, dict) and (data.get("schema") == "kv-guardian/redis-scan" or "rows" in data)


def redact_keyspace_json(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a scan's or diff's JSON as ``--redact`` would have written it: patterns and key names hashed,
    and every redacted name replaced by its hash in the free text (the findings' messages). A scan already
    written with ``--redact`` comes back as it is."""
    if data.get("redacted"):
        return data
    names = _Names()
    out: dict[str, Any] = redact_value(names, "", data)
    seen = {k: v for k, v in names.seen.items() if k and k != v}
    if seen:
        alternatives = "|".join(re.escape(k) for k in sorted(seen, key=len, reverse=True))
        out = _replace_names(out, seen, re.compile(alternatives))
    if data.get("schema") == "kv-guardian/redis-scan":
        out["redacted"] = True
    return out
