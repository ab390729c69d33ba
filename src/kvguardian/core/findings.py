"""Findings and reports: the one place where finding ids, their names and meanings are defined.

Every finding kv-guardian emits - at run time, from the paged pool, from a Redis sweep, from a watcher -
carries a stable id from `CATALOG`. The findings reference of the docs site is generated from this module
(``python -m kvguardian.core.findings``) and a test keeps the two in step.
"""

from __future__ import annotations

import enum
import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvguardian.core.errors import EXIT_FINDINGS, EXIT_OK, UsageError

__all__ = [
    "CATALOG",
    "Finding",
    "FindingKind",
    "Report",
    "Severity",
    "catalog_markdown",
    "json_default",
]

SCHEMA_VERSION = 1


class Severity(str, enum.Enum):
    """How sure we are. ``error``: proven; ``warning``: suspected, with the statistic; ``info``: bounded."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @classmethod
    def parse(cls, value: str | Severity) -> Severity:
        """Parse a severity name; raise `UsageError` naming the accepted values."""
        if isinstance(value, Severity):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise UsageError(
                f"unknown severity {value!r}; use one of: info, warning, error"
            ) from None


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


@dataclass(frozen=True)
class FindingKind:
    """One entry of the catalog: a stable id and what it means."""

    id: str  # stable, never reused: "KVG102"
    name: str  # stable kebab-case name: "orphaned-kv"
    severity: Severity  # the default severity; a detector may lower it (bounded) or raise it (proven)
    meaning: str  # one sentence for the findings reference
    fix: str  # what the user should do


def _k(id_: str, name: str, sev: Severity, meaning: str, fix: str) -> FindingKind:
    return FindingKind(id_, name, sev, meaning, fix)


_E, _W, _I = Severity.ERROR, Severity.WARNING, Severity.INFO

#: Every finding id kv-guardian knows, in one place. Ids are stable: add, never renumber.
CATALOG: dict[str, FindingKind] = {
    k.id: k
    for k in (
        _k("KVG100", "guard-degraded", _W,
           "the guard's own instrumentation failed and was switched to fail-open; counts may be incomplete",
           "report the logged exception; run with Guard(strict=True) in a test to get the traceback"),
        _k("KVG101", "grad-tracked-kv", _E,
           "a KV tensor has grad_fn/requires_grad: the autograd graph of every decode step is retained",
           "decode under torch.inference_mode() or torch.no_grad(), or detach the cache"),
        _k("KVG102", "orphaned-kv", _E,
           "KV alive after its owner request ended, not declared retained; carries a holder chain",
           "drop the reference named by the holder chain, or declare it with guard.retain(obj, reason=...)"),
        _k("KVG103", "kv-growth", _W,
           "retained KV grows across requests (a trend test over request ends, not one threshold)",
           "find what keeps each request's KV (see KVG102 holder chains) and bound or release it"),
        _k("KVG104", "cross-request-alias", _E,
           "one storage or block is reachable from two requests or tenants without a declared share",
           "bind blocks to (request, tenant); share only through a tenant-salted prefix cache"),
        _k("KVG105", "stale-generation", _E,
           "KV of a retired model generation is still alive after a reload",
           "drop caches (and caches of methods holding self) of the old model when reloading"),
        _k("KVG106", "rank-divergence", _E,
           "ranks disagree on which sequences' KV are alive",
           "release per-sequence KV on every rank together (broadcast, or ref count + all-reduce)"),
        _k("KVG107", "unknown-cache-layout", _W,
           "a cache or cache-layer class kv-guardian does not know was audited through the generic path",
           "check the accounting of that cache; report the class so kv-guardian can learn its layout"),
        _k("KVG201", "double-free", _E,
           "a KV block was freed more times than it was referenced",
           "free each block once per owner; make free idempotent per (request, block)"),
        _k("KVG202", "use-after-free-write", _E,
           "a request wrote into a KV block it does not own (freed or never allocated to it)",
           "bind the block table to the request and check ownership before every write"),
        _k("KVG203", "refcount-drift", _E,
           "a block's ref count differs from the number of live block tables that reference it",
           "update ref counts only through the pool's allocate/fork/free operations"),
        _k("KVG204", "lost-free", _E,
           "a block is still referenced after its request finished (a free was lost, e.g. on abort)",
           "free on every exit path of a request: finish, abort, preemption, transfer failure"),
        _k("KVG205", "cross-tenant-block", _E,
           "one KV block is in the block tables of two tenants without a shared namespace",
           "salt prefix hashes per tenant; opt into a shared namespace explicitly"),
        _k("KVG206", "conservation-violated", _E,
           "free + cached + referenced blocks (or tokens) do not add up to the pool's total",
           "the pool lost or duplicated blocks: audit every allocate/free path"),
        _k("KVG207", "idle-kv-usage", _W,
           "a server reports KV usage while it runs and queues no request, past a grace period",
           "find the request or prefix entry that was never freed (abort paths, transfers)"),
        _k("KVG208", "prefix-index-growth", _W,
           "a prefix-cache index keeps growing: blocks are stored and never removed",
           "check eviction; check that cache salts or extra keys do not make every prefix unique"),
        _k("KVG209", "kv-event-gap", _W,
           "KV events were lost (sequence gap) and could not be replayed; the audit is incomplete",
           "enable the replay endpoint, or raise the publisher's buffer"),
        _k("KVG210", "kv-read-outside-ownership", _E,
           "a kernel read a KV slot outside its sequence's blocks or past its length (Triton sanitizer)",
           "index the block table by the program's own sequence and mask reads at its length"),
        _k("KVG211", "kv-residue-read", _E,
           "attention read a KV slot its block's owner never wrote since allocation: another request's "
           "(or tenant's) remanent K/V, or scrubbed zeros",
           "mask reads to the sequence's length; scrub blocks on tenant change (scrub='on-tenant-change')"),
        _k("KVG212", "cross-tenant-cache-sharing", _E,
           "a server's prefix cache serves one tenant's prompt to another: a timing audit found a repeated "
           "prompt answered faster for another tenant's key",
           "salt the prefix cache per tenant from the API key (vLLM: a per-tenant cache_salt set by the gateway)"),
        _k("KVG301", "cold-no-ttl-keys", _E,
           "Redis keys with no TTL that nobody has read for longer than the threshold: the leak signature",
           "set a TTL (SET ... EX / EXPIRE) where these keys are written, then expire the backlog"),
        _k("KVG302", "key-name-explosion", _E,
           "a no-TTL key pattern embeds a timestamp or UUID, so every write creates a new key forever",
           "stop embedding the timestamp/UUID in the key, or give the key a TTL"),
        _k("KVG303", "keyspace-growth", _W,
           "a key pattern's keys or bytes grew between two scans",
           "bound the pattern: TTL, eviction, or a cap where it is written"),
        _k("KVG304", "growing-collection", _W,
           "collections of a pattern keep growing per key between scans (lists, sets, hashes, streams)",
           "bound the collection (LTRIM, XADD MAXLEN, expire old fields)"),
        _k("KVG305", "no-ttl-keys", _I,
           "a pattern holds keys with no TTL (not cold, not growing): worth a look, not a leak yet",
           "give the keys a TTL if they are cache entries"),
        _k("KVG401", "grad-tracked-decode-loop", _W,
           "a manual decode loop feeds the cache back to the model outside no_grad/inference_mode (lint)",
           "wrap the loop (or decorate its function) with torch.inference_mode() or torch.no_grad()"),
        _k("KVG402", "global-kv-store", _W,
           "per-request KV or generate() outputs are stored in a module- or class-level container "
           "that nothing bounds or empties (lint)",
           "keep per-request results in the request's scope, or bound the container (deque(maxlen=...), pop)"),
        _k("KVG403", "unbounded-memo", _W,
           "an unbounded memo (functools.cache, lru_cache(maxsize=None)) takes or returns caches/outputs, "
           "or lru_cache on a method keeps self alive (lint)",
           "bound the memo, key it by plain values, or cache on the instance (functools.cached_property)"),
        _k("KVG404", "kept-exception", _W,
           "an exception, traceback or sys.exc_info() is kept in module-level state: its frames keep "
           "their locals (caches) alive (lint)",
           "keep a formatted string (traceback.format_exc()) or the exception's type and message instead"),
        _k("KVG405", "redis-key-no-ttl", _W,
           "a Redis write without expiry whose key embeds a timestamp or UUID: a new key per call, "
           "forever (lint: Python, Go, Java, Kotlin)",
           "pass an expiry (ex=/px=, a non-zero expiration, SetArgs.ex) or call EXPIRE on the key"),
        _k("KVG406", "handler-callback-registry", _W,
           "a request handler appends a closure or callback to a module-level list that never removes it (lint)",
           "register once at start-up, or remove the callback when the request ends (try/finally)"),
        _k("KVG407", "request-map-no-removal", _W,
           "an attribute map is filled per request id and nothing in the module ever removes an entry (lint)",
           "pop the request's entry on every exit path (finish, abort, error)"),
    )
}


def catalog_markdown() -> str:
    """The finding-id table (Markdown), generated from `CATALOG`."""
    rows = ["| id | name | severity | meaning |", "|---|---|---|---|"]
    for kind in CATALOG.values():
        rows.append(f"| {kind.id} | {kind.name} | {kind.severity.value} | {kind.meaning} |")
    return "\n".join(rows)


@dataclass
class Finding:
    """One proven or suspected problem, with the evidence that supports it.

    Evidence never contains KV contents or prompt text: sizes, counts, ids, layers, statistics.
    """

    id: str  # a key of CATALOG
    severity: Severity
    message: str  # one readable sentence with the numbers
    evidence: dict[str, Any] = field(default_factory=dict)
    holder_chain: list[str] | None = None  # rendered steps, root first
    name: str = ""  # filled from CATALOG
    fix: str = ""  # filled from CATALOG unless a detector has a sharper fix

    def __post_init__(self) -> None:
        kind = CATALOG.get(self.id)
        if kind is None:
            raise UsageError(f"unknown finding id {self.id!r}; known ids are listed in "
                             "kvguardian.core.findings.CATALOG")
        self.severity = Severity.parse(self.severity)
        if not self.name:
            self.name = kind.name
        if not self.fix:
            self.fix = kind.fix

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "severity": self.severity.value,
            "message": self.message,
            "evidence": self.evidence,
            "holder_chain": self.holder_chain,
            "fix": self.fix,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        return cls(
            id=data["id"],
            severity=Severity.parse(data["severity"]),
            message=data["message"],
            evidence=dict(data.get("evidence") or {}),
            holder_chain=list(data["holder_chain"]) if data.get("holder_chain") else None,
            name=data.get("name", ""),
            fix=data.get("fix", ""),
        )

    def render_chain(self) -> str:
        """The holder chain on one line, root first (``a → b → c``), or an empty string."""
        return " → ".join(self.holder_chain) if self.holder_chain else ""


@dataclass
class Report:
    """Findings plus a summary; what `Guard.check()` and every analysis command return."""

    findings: list[Finding] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    tool: str = "kv-guardian"
    created: float = field(default_factory=time.time)

    def extend(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    def by_id(self, id_: str) -> list[Finding]:
        return [f for f in self.findings if f.id == id_]

    def ids(self) -> set[str]:
        return {f.id for f in self.findings}

    def counts(self) -> dict[str, int]:
        """Number of findings per severity name (all three keys always present)."""
        c = Counter(f.severity.value for f in self.findings)
        return {s.value: c.get(s.value, 0) for s in Severity}

    def worst(self) -> Severity | None:
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=lambda s: s.rank)

    def exit_code(self, fail_on: Severity | str = Severity.ERROR) -> int:
        """`EXIT_FINDINGS` when any finding is at or above ``fail_on``, else `EXIT_OK`."""
        threshold = Severity.parse(fail_on)
        worst = self.worst()
        if worst is not None and worst.rank >= threshold.rank:
            return EXIT_FINDINGS
        return EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "tool": self.tool,
            "created": self.created,
            "summary": self.summary,
            "counts": self.counts(),
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, default=json_default)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        return cls(
            findings=[Finding.from_dict(f) for f in data.get("findings", [])],
            summary=dict(data.get("summary") or {}),
            tool=data.get("tool", "kv-guardian"),
            created=float(data.get("created", time.time())),
        )

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))


def json_default(obj: object) -> object:
    """`json.dumps` ``default=`` for report data: enums by value, sets and tuples as lists, numpy scalars as
    numbers, anything else as its ``str``."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    item = getattr(obj, "item", None)  # numpy scalars
    if callable(item):
        return item()
    return str(obj)


if __name__ == "__main__":  # pragma: no cover
    print(catalog_markdown())
