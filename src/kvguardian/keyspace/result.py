"""The result of a scan and its JSON form (``kv-guardian redis scan --json``), which ``redis diff`` reads.

Schema ``kv-guardian/redis-scan`` version 1 — stable: fields are only added, never renamed or removed. Byte
figures are ``MEMORY USAGE`` (5 elements sampled per collection), p50 values come from log histograms, and key
names are UTF-8 with ``\\xNN`` escapes, cut at 200 characters. The field-by-field schema:
docs/design/keyspace.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Finding, Report
from kvguardian.core.input_file import MAX_DOCUMENT_BYTES, read_input
from kvguardian.core.report import secrets
from kvguardian.core.report.escape import dumps
from kvguardian.keyspace.tokens import key_str

__all__ = ["SCHEMA", "VERSION", "ScanResult", "key_text", "load_result"]

SCHEMA = "kv-guardian/redis-scan"
VERSION = 1
KEY_CHARS = 200


def key_text(raw: bytes | str | None) -> str | None:
    """A key name for reports: UTF-8 with ``\\xNN`` escapes and backslashes doubled (`tokens.key_str`), cut at
    `KEY_CHARS` characters."""
    if raw is None:
        return None
    text = key_str(raw) if isinstance(raw, bytes) else raw
    if len(text) > KEY_CHARS:
        text = text[:KEY_CHARS] + f"…(+{len(text) - KEY_CHARS} chars)"
    return text


@dataclass
class ScanResult:
    """One scan; `to_dict` is the documented JSON (module docstring)."""

    target: str
    started: float
    finished: float = 0.0
    complete: bool = True
    incomplete_reason: str | None = None
    sample: int | None = None
    mode: str = "lua"
    mode_reason: str = ""
    server: dict[str, Any] = field(default_factory=dict)
    idle_metric: str = "idletime"
    cold_after: float = 0.0
    dbsize: int = 0
    keys_scanned: int = 0
    keys_vanished: int = 0
    bytes: int = 0
    redacted: bool = False
    warnings: list[str] = field(default_factory=list)
    patterns: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return max(0.0, self.finished - self.started)

    @property
    def keys_per_s(self) -> float:
        return self.keys_scanned / self.duration_s if self.duration_s > 0 else 0.0

    def report(self) -> Report:
        """The findings as a `Report` made when the scan finished."""
        return Report(findings=list(self.findings), summary={"target": self.target, "keys": self.keys_scanned},
                      created=self.finished or self.started)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "target": self.target,
            "started": self.started,
            "finished": self.finished,
            "created": self.finished or self.started,
            "duration_s": round(self.duration_s, 3),
            "complete": self.complete,
            "incomplete_reason": self.incomplete_reason,
            "sample": self.sample,
            "mode": self.mode,
            "mode_reason": self.mode_reason,
            "server": self.server,
            "idle_metric": self.idle_metric,
            "cold_after": self.cold_after,
            "dbsize": self.dbsize,
            "keys_scanned": self.keys_scanned,
            "keys_vanished": self.keys_vanished,
            "bytes": self.bytes,
            "keys_per_s": round(self.keys_per_s, 1),
            "redacted": self.redacted,
            "warnings": list(self.warnings),
            "patterns": self.patterns,
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_json(self) -> str:
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "the scan file") -> ScanResult:
        """Parse the documented JSON; raise `UsageError` naming the file and the problem."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise UsageError(f"{where} is not a kv-guardian Redis scan (no \"schema\": \"{SCHEMA}\"); "
                             "write one with: kv-guardian redis scan URL --json > FILE")
        if data.get("version") != VERSION:
            raise UsageError(f"{where} has scan schema version {data.get('version')!r}; this kv-guardian reads "
                             f"version {VERSION}")
        try:
            return cls._parse(data)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, UsageError) as exc:
            raise UsageError(f"{where} is a damaged kv-guardian Redis scan ({type(exc).__name__}: {exc}); "
                             "scan again") from None

    @classmethod
    def _parse(cls, data: dict[str, Any]) -> ScanResult:
        patterns = data["patterns"]
        if not isinstance(patterns, list):
            raise ValueError("'patterns' must be a list")
        for p in patterns:
            _check_pattern(p)
        return cls(
            target=str(data["target"]), started=_time(data, "started"), finished=_time(data, "finished"),
            complete=_bool(data["complete"]), incomplete_reason=_opt_str(data.get("incomplete_reason")),
            sample=_opt_int(data.get("sample")), mode=str(data.get("mode", "")),
            mode_reason=str(data.get("mode_reason", "")), server=_server(data.get("server") or {}),
            idle_metric=str(data.get("idle_metric", "idletime")), cold_after=_number(data.get("cold_after", 0)),
            dbsize=_count(data.get("dbsize", 0)), keys_scanned=_count(data["keys_scanned"]),
            keys_vanished=_count(data.get("keys_vanished", 0)), bytes=_count(data.get("bytes", 0)),
            redacted=_bool(data.get("redacted", False)), warnings=[str(w) for w in data.get("warnings") or []],
            patterns=patterns, findings=[Finding.from_dict(f) for f in data.get("findings") or []],
        )


_PATTERN_COUNTS = ("keys", "bytes", "bytes_p50", "bytes_max", "no_ttl_keys", "no_ttl_bytes", "cold_keys",
                   "cold_bytes", "collection_keys", "collection_bytes")


def _check_pattern(p: object) -> None:
    """One pattern row as the verdicts, the diff, the tables and the metrics read it (fills defaults)."""
    if not isinstance(p, dict) or not isinstance(p.get("pattern"), str):
        raise ValueError(f"bad pattern entry {str(p)[:80]!r}")
    name = p["pattern"][:60]
    for k in _PATTERN_COUNTS:
        p[k] = _count(p[k] if k in ("keys", "bytes") else p.get(k, 0), f"{name!r}: {k}")
    for k in ("ttl", "types"):
        p[k] = {str(kk): _count(v, f"{name!r}: {k}[{kk!r}]") for kk, v in _dict(p.get(k, {})).items()}
    for k in ("idle_s", "lfu_freq"):
        if k in p:
            p[k] = {q: None if v is None else _number(v, f"{name!r}: {k}[{q!r}]") for q, v in _dict(p[k]).items()}
    for k in ("example_key", "example_cold_key", "example_no_ttl_key"):
        if p.get(k) is not None and not isinstance(p[k], str):
            raise ValueError(f"{name!r}: {k} must be a string or null")
    p["overflow"] = _bool(p.get("overflow", False))
    p["placeholders"] = [str(x) for x in p.get("placeholders") or []]
    top = p.get("top_keys", [])
    if not isinstance(top, list) or not all(isinstance(t, dict) and isinstance(t.get("key"), str) for t in top):
        raise ValueError(f"{name!r}: top_keys must be a list of {{key, bytes}}")
    for t in top:
        t["bytes"] = _count(t.get("bytes", 0), f"{name!r}: top_keys.bytes")


def _server(v: object) -> dict[str, Any]:
    server = _dict(v)
    nodes = server.get("nodes") or []
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get("role", ""), str)
                                              for n in nodes):
        raise ValueError("server.nodes must be a list of {addr, role, …}")
    return server


def _number(v: object, what: str = "a number") -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{what} must be a finite number, got {str(v)[:40]!r}")
    return float(v)


def _time(data: dict[str, Any], key: str) -> float:
    value = _number(data[key], f"{key!r}")
    if value < 0:
        raise ValueError(f"{key!r} must be a Unix time >= 0, got {value}")
    return value


def _count(v: object, what: str = "a count") -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {str(v)[:40]!r}")
    return v


def _bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {str(v)[:40]!r}")
    return v


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


def _opt_int(v: object) -> int | None:
    return None if v is None else _count(v, "'sample'")


def _dict(v: object) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"expected an object, got {str(v)[:40]!r}")
    return v


def load_result(path: str | Path) -> ScanResult:
    """Read a scan JSON file; every problem is one `UsageError` line naming the file."""
    p = Path(path)
    try:
        text = read_input(p, f"scan file {str(p)!r}", max_bytes=MAX_DOCUMENT_BYTES).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"scan file {str(p)!r} is not UTF-8 text (byte {exc.start}); write one with: "
                         "kv-guardian redis scan URL --json > FILE") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        where = (f"line {exc.lineno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError)
                 else "nested too deep" if isinstance(exc, RecursionError) else str(exc))
        raise UsageError(f"scan file {str(p)!r} is not JSON ({where}); "
                         "write one with: kv-guardian redis scan URL --json > FILE") from None
    secrets.remember_urls_in(data)  # a credential an older writer left in "target" is shown as ***
    return ScanResult.from_dict(data, where=f"scan file {str(p)!r}")


def _no_constant(name: str) -> None:
    """``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (Python's parser accepts them by default)."""
    raise ValueError(f"{name} is not a JSON value")
