"""The result of a sweep and its JSON form (``kv-guardian redis scan --json``), which ``redis diff`` reads.

Schema ``kv-guardian/redis-scan`` version 1 — stable: fields are only added, never renamed or removed.

Top level:

=====================  ===========================================================================
``schema``             ``"kv-guardian/redis-scan"``
``version``            ``1``
``target``             the URL without its password
``started``            Unix time the sweep started; ``finished``: when it stopped; ``duration_s``
``complete``           false when interrupted (Ctrl-C), cut short by ``--sample``, or the server was lost
``incomplete_reason``  why not complete, or null
``sample``             the ``--sample`` limit, or null
``mode``               ``"lua"`` or ``"pipeline"``; ``mode_reason`` says why
``server``             ``version``, ``cluster``, ``maxmemory_policy``, ``nodes``: [{``addr``, ``role``,
                       ``dbsize``, ``uptime_s``, ``keys_scanned``}]
``idle_metric``        ``"idletime"`` (seconds, ``idle_s`` fields) or ``"freq"`` (LFU counter, ``lfu_freq``)
``cold_after``         seconds of idle (or the LFU counter ceiling) that make a no-TTL key cold
``dbsize``             keys on the swept nodes at the start; ``keys_scanned``, ``keys_vanished``, ``bytes``
``keys_per_s``         keys probed per second
``redacted``           whether key-name literals are replaced by stable hashes
``warnings``           list of strings
``patterns``           list, largest ``bytes`` first: ``pattern``, ``placeholders``, ``overflow``, ``keys``,
                       ``bytes``, ``bytes_p50``, ``bytes_max``, ``no_ttl_keys``, ``no_ttl_bytes``,
                       ``cold_keys``, ``cold_bytes``, ``collection_keys``, ``collection_bytes``,
                       ``ttl`` {none, lt_1m, lt_10m, lt_1h, lt_1d, lt_7d, lt_30d, ge_30d},
                       ``idle_s`` or ``lfu_freq`` {p50, p90, max}, ``types`` {name: keys},
                       ``top_keys`` [{key, bytes, type, ttl_ms, idle_s | lfu_freq}],
                       ``example_key``, ``example_cold_key``
``findings``           kv-guardian findings (``kvguardian.findings.Finding.to_dict``)
=====================  ===========================================================================

Byte figures are ``MEMORY USAGE`` (which samples 5 elements of a collection); p50 values come from log
histograms (±9 %). Key names are UTF-8 with ``\\xNN`` escapes for other bytes, cut at 200 characters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvguardian._errors import UsageError
from kvguardian.findings import Finding, Report

__all__ = ["SCHEMA", "VERSION", "ScanResult", "key_text", "load_result"]

SCHEMA = "kv-guardian/redis-scan"
VERSION = 1
KEY_CHARS = 200


def key_text(raw: bytes | str | None) -> str | None:
    """A key name for reports: UTF-8 with ``\\xNN`` escapes, cut at `KEY_CHARS` characters."""
    if raw is None:
        return None
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    if len(text) > KEY_CHARS:
        text = text[:KEY_CHARS] + f"…(+{len(text) - KEY_CHARS} chars)"
    return text


@dataclass
class ScanResult:
    """One sweep; `to_dict` is the documented JSON (module docstring)."""

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
        return Report(findings=list(self.findings), summary={"target": self.target, "keys": self.keys_scanned})

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "target": self.target,
            "started": self.started,
            "finished": self.finished,
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
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

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
            patterns = list(data["patterns"])
            for p in patterns:
                if not isinstance(p, dict) or not isinstance(p["pattern"], str) or int(p["keys"]) < 0:
                    raise ValueError(f"bad pattern entry {str(p)[:80]}")
            return cls(
                target=str(data["target"]), started=float(data["started"]), finished=float(data["finished"]),
                complete=bool(data["complete"]), incomplete_reason=data.get("incomplete_reason"),
                sample=data.get("sample"), mode=str(data.get("mode", "")),
                mode_reason=str(data.get("mode_reason", "")), server=dict(data.get("server") or {}),
                idle_metric=str(data.get("idle_metric", "idletime")), cold_after=float(data.get("cold_after", 0)),
                dbsize=int(data.get("dbsize", 0)), keys_scanned=int(data["keys_scanned"]),
                keys_vanished=int(data.get("keys_vanished", 0)), bytes=int(data.get("bytes", 0)),
                redacted=bool(data.get("redacted", False)), warnings=list(data.get("warnings") or []),
                patterns=patterns, findings=[Finding.from_dict(f) for f in data.get("findings") or []],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{where} is a damaged kv-guardian Redis scan ({type(exc).__name__}: {exc}); "
                             "scan again") from None


def load_result(path: str | Path) -> ScanResult:
    """Read a scan JSON file; every problem is one `UsageError` line naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read scan file {str(p)!r}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"scan file {str(p)!r} is not JSON (line {exc.lineno}: {exc.msg}); "
                         "write one with: kv-guardian redis scan URL --json > FILE") from None
    return ScanResult.from_dict(data, where=f"scan file {str(p)!r}")
