"""Credentials kv-guardian has seen (a password or token in a URL, ``REDISCLI_AUTH``), masked as ``***``
wherever kv-guardian writes: the console and JSON reporters and every error line apply `mask`.

A source registers what it reads with `remember`; nothing here is ever written anywhere. Values shorter
than 3 characters are not masked in free text (every "a" would go), only where the credential sits
(`kvguardian.keyspace.connect.display_url`).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["SECRET_QUERY", "has_secrets", "mask", "remember", "remember_url", "remember_urls_in"]

#: query parameters whose value is a credential (password=, auth=, token=, access_token=, api_key=, ...)
SECRET_QUERY = re.compile(r"pass|auth|token|secret|key|signature", re.IGNORECASE)

_MIN = 3
_secrets: set[str] = set()


def remember(value: str | None) -> None:
    """Mask ``value`` in everything kv-guardian writes from now on."""
    if value and len(value) >= _MIN:
        _secrets.add(value)


def remember_url(url: str | None) -> None:
    """Mask the credentials of ``url`` (any scheme): the userinfo password (as written and decoded) and the
    values of `SECRET_QUERY` parameters. A URL that does not parse registers nothing."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        password = parts.password
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return
    if password is not None:
        remember(password)
        remember(unquote(password))
    for key, value in query:
        if SECRET_QUERY.search(key):
            remember(value)


def remember_urls_in(data: object) -> None:
    """`remember_url` for every string in JSON ``data`` that looks like a URL with a credential: a file read
    back (a scan's ``target``, a watch's ``metrics_url``) may come from an older or another writer that did
    not mask it, and is shown again by ``report``, ``redis diff`` and ``--compare``."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "://" in item and ("@" in item or "=" in item):
                remember_url(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


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
