"""Verdicts on a scan (KVG301 cold no-TTL keys, KVG302 key-name explosion, KVG305 no-TTL keys) and on two
scans (KVG303 key-space growth, KVG304 growing collections). Pure functions of `ScanResult` data.

Every finding names the pattern, the counts and bytes, an example key (already redacted when the result
is) and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Finding, Severity
from kvguardian.keyspace.result import ScanResult
from kvguardian.keyspace.tokens import UNIQUE_CLASSES
from kvguardian.keyspace.windows import windowed_patterns

__all__ = ["Thresholds", "diff", "human_bytes", "human_seconds", "scan_findings"]


@dataclass
class Thresholds:
    """When a pattern is worth a finding."""

    min_keys: int = 10  # a pattern needs this many no-TTL (or cold, or new) keys
    min_growth_ratio: float = 0.10  # KVG303/304: growth relative to the old scan
    min_growth_bytes: int = 1 << 20  # KVG303: or this many bytes more
    min_collection_growth_bytes: int = 64  # KVG304: per key, on average


def human_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def human_seconds(s: float | None) -> str:
    if s is None:
        return "—"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit}"
    return f"{s:.0f}s"


def _idle_phrase(result: ScanResult, p: dict[str, Any]) -> str:
    if result.idle_metric == "freq":
        f = p.get("lfu_freq") or {}
        return f"LFU counter p50 {f.get('p50')}, max {f.get('max')}"
    i = p.get("idle_s") or {}
    return (f"idle p50 {human_seconds(i.get('p50'))}, p90 {human_seconds(i.get('p90'))}, "
            f"max {human_seconds(i.get('max'))}")


def scan_findings(result: ScanResult, th: Thresholds | None = None) -> list[Finding]:
    """KVG301/302/305 for each pattern of one scan."""
    th = th or Thresholds()
    out: list[Finding] = []
    roles = {n.get("role", "master") for n in (result.server.get("nodes") or [])}
    windows = windowed_patterns(result.patterns, result.started)
    cold_ok = roles <= {"master", "rdb"}  # a replica's idle times are its own reads; a snapshot's, its writer's
    for p in result.patterns:
        pat = p["pattern"]
        base = {"pattern": pat, "keys": p["keys"], "bytes": p["bytes"], "no_ttl_keys": p["no_ttl_keys"],
                "no_ttl_bytes": p["no_ttl_bytes"], "example_key": p.get("example_no_ttl_key") or p.get("example_key")}
        unique = [c for c in p.get("placeholders", []) if c in UNIQUE_CLASSES]
        window = None if unique else windows.get(pat)
        flagged = False
        if cold_ok and p["cold_keys"] >= th.min_keys:
            flagged = True
            cold_what = (f"an LFU counter ≤ {result.cold_after:g}" if result.idle_metric == "freq"
                         else f"no read for ≥ {human_seconds(result.cold_after)}")
            out.append(Finding(
                "KVG301", Severity.ERROR,
                f"{p['cold_keys']} of {p['keys']} keys of {pat} have no TTL and {cold_what} "
                f"({human_bytes(p['cold_bytes'])}); {_idle_phrase(result, p)}",
                {**base, "cold_keys": p["cold_keys"], "cold_bytes": p["cold_bytes"],
                 "example_key": p.get("example_cold_key") or p.get("example_key"),
                 "idle": p.get("idle_s") or p.get("lfu_freq"), "cold_after": result.cold_after},
                fix=f"set a TTL where {pat} is written (SET … EX n / EXPIRE), then expire or delete the "
                    f"{p['cold_keys']} cold keys already there",
            ))
        if unique and p["no_ttl_keys"] >= th.min_keys and not p.get("overflow"):
            flagged = True
            cls = ", ".join(unique)
            out.append(Finding(
                "KVG302", Severity.ERROR,
                f"{pat} embeds a {cls} in the key name and {p['no_ttl_keys']} of its {p['keys']} keys have no TTL "
                f"({human_bytes(p['no_ttl_bytes'])}): every write makes a new key that never goes away",
                {**base, "placeholders": unique},
                fix=f"stop putting the {cls} in the key name (key by the stable part and overwrite), "
                    f"or give {pat} a TTL",
            ))
        if window and p["no_ttl_keys"] >= th.min_keys and not p.get("overflow"):
            flagged = True
            out.append(Finding(
                "KVG302", Severity.ERROR,
                f"{pat} names a time window (Unix time in {window}s) and {p['no_ttl_keys']} of its {p['keys']} keys "
                f"have no TTL ({human_bytes(p['no_ttl_bytes'])}): every {window} makes new keys, and a window's "
                "keys stay after it ends",
                {**base, "placeholders": ["int"], "time_window": window},
                fix=f"give {pat} a TTL of a few {window}s where it is written (SET … EX n, or EXPIRE after INCR)",
            ))
        if not flagged and p["no_ttl_keys"] >= th.min_keys:
            out.append(Finding(
                "KVG305", Severity.INFO,
                f"{p['no_ttl_keys']} of {p['keys']} keys of {pat} have no TTL ({human_bytes(p['no_ttl_bytes'])}); "
                f"{_idle_phrase(result, p)}",
                base,
            ))
    return out


def diff(old: ScanResult, new: ScanResult, th: Thresholds | None = None) -> tuple[list[dict[str, Any]], list[Finding],
                                                                                 list[str]]:
    """Per-pattern growth from ``old`` to ``new``: (rows, KVG303/KVG304 findings, warnings).

    Raises:
        UsageError: one scan is redacted and the other is not (patterns would not match).
    """
    th = th or Thresholds()
    if old.redacted != new.redacted:
        raise UsageError("one scan is redacted and the other is not, so their patterns cannot be matched; "
                         "scan both with --redact or both without")
    warnings = []
    if old.target != new.target:
        warnings.append(f"the scans are of different targets ({old.target} vs {new.target})")
    for name, r in (("OLD", old), ("NEW", new)):
        if not r.complete:
            warnings.append(f"{name} is incomplete ({r.incomplete_reason}): growth figures are only indicative")
    hours = (new.started - old.started) / 3600
    if hours <= 0:
        raise UsageError(f"NEW ({new.target}, started {new.started:.0f}) is not later than OLD "
                         f"(started {old.started:.0f}); pass the older scan first")
    olds = {p["pattern"]: p for p in old.patterns}
    rows: list[dict[str, Any]] = []
    findings: list[Finding] = []
    for p in new.patterns:
        o = olds.get(p["pattern"], {})
        row = _growth_row(p, o, hours)
        rows.append(row)
        dk, db = row["keys_delta"], row["bytes_delta"]
        ratio = dk / max(row["keys_old"], 1)
        bratio = db / max(row["bytes_old"], 1)
        if (dk >= th.min_keys and ratio >= th.min_growth_ratio) or (
                db >= th.min_growth_bytes and bratio >= th.min_growth_ratio):
            findings.append(Finding(
                "KVG303", Severity.WARNING,
                f"{p['pattern']} grew by {dk:+d} keys ({ratio:+.0%}) and {human_bytes(db)} in {hours:.2f} h: "
                f"{row['keys_per_hour']:+.0f} keys/h, {human_bytes(row['bytes_per_hour'])}/h; "
                f"{p['no_ttl_keys']} keys have no TTL",
                {**row, "example_key": p.get("example_key")},
                fix=f"bound {p['pattern']}: give it a TTL, an eviction policy, or a cap where it is written",
            ))
        grown = _grown_collections(p, o, th)
        if grown is not None:
            findings.append(grown)
    return rows, findings, warnings


def _growth_row(p: dict[str, Any], o: dict[str, Any], hours: float) -> dict[str, Any]:
    ko, kn = int(o.get("keys", 0)), int(p["keys"])
    bo, bn = int(o.get("bytes", 0)), int(p["bytes"])
    return {
        "pattern": p["pattern"], "new_pattern": not o,
        "keys_old": ko, "keys_new": kn, "keys_delta": kn - ko,
        "bytes_old": bo, "bytes_new": bn, "bytes_delta": bn - bo,
        "hours": round(hours, 4),
        "keys_per_hour": round((kn - ko) / hours, 2), "bytes_per_hour": round((bn - bo) / hours, 2),
        "collection_bytes_per_key_old": _per_key(o), "collection_bytes_per_key_new": _per_key(p),
    }


def _per_key(p: dict[str, Any]) -> float | None:
    n = int(p.get("collection_keys", 0) or 0)
    return round(int(p.get("collection_bytes", 0)) / n, 1) if n else None


def _grown_collections(p: dict[str, Any], o: dict[str, Any], th: Thresholds) -> Finding | None:
    """KVG304: collections of this pattern got bigger per key (on average, and the same top keys)."""
    old_pk, new_pk = _per_key(o), _per_key(p)
    if old_pk is None or new_pk is None:
        return None
    same = {t["key"]: t for t in o.get("top_keys", [])}
    per_key = [{"key": t["key"], "bytes_old": same[t["key"]]["bytes"], "bytes_new": t["bytes"]}
               for t in p.get("top_keys", []) if t["key"] in same and t["bytes"] > same[t["key"]]["bytes"]]
    growth = new_pk - old_pk
    if growth < th.min_collection_growth_bytes or growth / old_pk < th.min_growth_ratio:
        return None
    example = per_key[0]["key"] if per_key else p.get("example_key")
    return Finding(
        "KVG304", Severity.WARNING,
        f"collections of {p['pattern']} grew from {human_bytes(old_pk)} to {human_bytes(new_pk)} per key on "
        f"average ({growth / old_pk:+.0%}); {len(per_key)} of its largest keys grew",
        {"pattern": p["pattern"], "collection_keys": p["collection_keys"],
         "bytes_per_key_old": old_pk, "bytes_per_key_new": new_pk, "grown_top_keys": per_key,
         "example_key": example, "types": p.get("types")},
        fix=f"bound the collections of {p['pattern']}: LTRIM after LPUSH, XADD … MAXLEN, expire or HDEL old "
            "fields, or a TTL on the key",
    )
