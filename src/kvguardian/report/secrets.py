"""Credentials kv-guardian has seen (a Redis password from a URL or ``REDISCLI_AUTH``), masked as ``***``
wherever kv-guardian writes: the console and JSON reporters and every error line apply `mask`.

A source registers what it reads with `remember`; nothing here is ever written anywhere. Values shorter
than 3 characters are not masked in free text (every "a" would go), only where the credential sits
(`kvguardian.keyspace.connect.display_url`).
"""

from __future__ import annotations

__all__ = ["has_secrets", "mask", "remember"]

_MIN = 3
_secrets: set[str] = set()


def remember(value: str | None) -> None:
    """Mask ``value`` in everything kv-guardian writes from now on."""
    if value and len(value) >= _MIN:
        _secrets.add(value)


def has_secrets() -> bool:
    return bool(_secrets)


def mask(text: str) -> str:
    """``text`` with every remembered credential replaced by ``***``."""
    if not _secrets:
        return text
    for value in sorted(_secrets, key=len, reverse=True):
        if value in text:
            text = text.replace(value, "***")
    return text
