"""Who a request belongs to, and which prefix-cache namespace it may share blocks in.

API keys map to tenants (``Authorization: Bearer KEY``); keys are kept only as SHA-256 digests and never shown.
Cache modes ``off``, ``global``, ``per-salt`` (vLLM's ``cache_salt``, which "is not an isolation boundary") and
``per-tenant`` (the default: the boundary comes from the API key, so a client cannot opt out). Salts are
hashed before they name a namespace. The mode table and its rationale: docs/design/apps.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from kvguardian.core.errors import UsageError
from kvguardian.core.input_file import read_input

__all__ = ["CACHE_MODES", "KeyRing", "namespace_of"]

CACHE_MODES = ("off", "global", "per-salt", "per-tenant")
ANONYMOUS = "default"
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def _salt_tag(salt: str) -> str:
    return hashlib.sha256(b"kvguardian/cache_salt\x00" + salt.encode("utf-8")).hexdigest()[:24]


def namespace_of(mode: str, tenant: str, salt: str | None) -> str | None:
    """The pool's ``shared=`` argument for a request (None: the tenant's own namespace)."""
    if mode == "global":
        return "all"
    if mode == "per-salt":
        return "salt=" + (_salt_tag(salt) if salt else "")
    if salt:  # per-tenant (and off, where nothing is cached anyway)
        return f"tenant={tenant};salt={_salt_tag(salt)}"
    return None


@dataclass(frozen=True)
class KeyRing:
    """API-key digests -> tenant names. Empty: no key needed, every request is tenant ``default``."""

    tenants: dict[bytes, str]

    @classmethod
    def from_pairs(cls, pairs: Iterable[str], files: Iterable[str] = ()) -> KeyRing:
        """``TENANT=KEY`` pairs (``--api-key``) and files (``--keys-file``: JSON ``{"KEY": "TENANT"}`` or lines
        ``TENANT KEY``).

        Raises:
            UsageError: a malformed pair, file or tenant name, or a key given twice (never printing the key).
        """
        out: dict[bytes, str] = {}
        entries = [(p, "--api-key") for p in pairs]
        for f in files:
            keys = _read_keys_file(f)
            if not keys:  # an empty file must not leave the server open to anyone (no keys: no authentication)
                raise UsageError(f"--keys-file {f} holds no API key; fix: one TENANT KEY per line, or "
                                 '{"KEY": "TENANT"} JSON')
            entries.extend((e, f"--keys-file {f}") for e in keys)
        for entry, where in entries:
            parts = entry.strip().split(None, 1)
            tenant, sep, key = (parts[0], " ", parts[1]) if len(parts) == 2 else entry.partition("=")
            tenant, key = tenant.strip(), key.strip()
            if not sep or not key:
                raise UsageError(f"{where}: expected TENANT=KEY; fix: --api-key acme=sk-...")
            if not _TENANT.match(tenant):
                raise UsageError(f"{where}: tenant name {tenant[:64]!r} must be 1-64 of [A-Za-z0-9_.-]")
            d = _digest(key)
            if d in out:
                raise UsageError(f"{where}: a key of tenant {tenant!r} is also given for {out[d]!r}; keys must be "
                                 "unique")
            out[d] = tenant
        return cls(out)

    @property
    def required(self) -> bool:
        return bool(self.tenants)

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of an ``Authorization`` header value; None when a key is needed and this one is not
        known (or missing)."""
        if not self.tenants:
            return ANONYMOUS
        if not authorization or authorization[:7].lower() != "bearer ":
            return None
        return self.tenants.get(_digest(authorization[7:].strip()))


def _read_keys_file(path: str) -> list[str]:
    try:
        text = read_input(path, f"--keys-file {path}", max_bytes=1 << 20).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--keys-file {path}: cannot read it ({exc})") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--keys-file {path}: not valid JSON ({exc})") from None
        return [f"{tenant}={key}" for key, tenant in data.items()]
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
