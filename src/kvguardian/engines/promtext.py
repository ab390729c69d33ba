"""Scrape a Prometheus text endpoint and index its samples by name.

Parsing uses prometheus_client's parser (the library vLLM and SGLang expose their metrics with), so names
with colons (``vllm:kv_cache_usage_perc``), escaped label values and ``_created`` samples are handled as
Prometheus does.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvguardian._errors import UsageError

__all__ = ["Sample", "Scrape", "ScrapeError", "check_url", "fetch", "parse"]

_MAX_BODY = 64 * 1024 * 1024  # a metrics page larger than this is refused, not buffered


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float

    def key(self, drop: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
        """The label set as a hashable key (optionally without some labels)."""
        dropped = set(drop)
        return tuple(sorted((k, v) for k, v in self.labels.items() if k not in dropped))


class ScrapeError(Exception):
    """A scrape failed; ``reason`` is one of: connect, http, parse, size."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Scrape(dict[str, list[Sample]]):
    """Samples of one scrape, by sample name."""

    def first(self, *names: str) -> list[Sample]:
        """The samples of the first of ``names`` present (e.g. a current name, then a legacy one)."""
        for name in names:
            if name in self:
                return self[name]
        return []


def check_url(url: str, flag: str = "--metrics") -> str:
    """Validate an http(s) URL; raises `UsageError` naming the flag and the fix."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{flag} {url!r} is not an http(s) URL; fix: e.g. {flag} http://127.0.0.1:8000/metrics")
    return url


def fetch(url: str, timeout: float = 5.0) -> str:
    """GET ``url`` and return its body as text.

    Raises:
        ScrapeError: connection refused / timed out, HTTP status >= 400, or a body over 64 MiB.
    """
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "kv-guardian"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read(_MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        raise ScrapeError("http", f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ScrapeError("connect", f"cannot reach {url}: {reason}") from None
    if len(body) > _MAX_BODY:
        raise ScrapeError("size", f"{url} returned more than {_MAX_BODY} bytes")
    return body.decode("utf-8", errors="replace")


def parse(text: str) -> Scrape:
    """Index the samples of a text exposition by sample name.

    Raises:
        ScrapeError: the text is not the Prometheus exposition format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out = Scrape()
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append(Sample(s.name, dict(s.labels), float(s.value)))
    except Exception as exc:  # the parser raises ValueError and friends on malformed lines
        raise ScrapeError("parse", f"not a Prometheus text exposition: {exc}") from None
    return out
