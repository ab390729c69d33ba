"""Scrape a Prometheus text endpoint and index its samples by name.

Parsing uses prometheus_client's parser (the library vLLM and SGLang expose their metrics with), so names
with colons (``vllm:kv_cache_usage_perc``), escaped label values and ``_created`` samples are handled as
Prometheus does.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvguardian.core.errors import UsageError

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
    """A scrape failed; ``reason`` is one of: connect, timeout, http, parse, size."""

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
    fix = f"fix: e.g. {flag} http://127.0.0.1:8000/metrics"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of 0-65535
    except ValueError as exc:
        raise UsageError(f"{flag} {url!r}: {exc}; {fix}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{flag} {url!r} is not an http(s) URL; {fix}")
    return url


def fetch(url: str, timeout: float = 5.0, *, abort: threading.Event | None = None) -> str:
    """GET ``url`` and return its body as text, within ``timeout`` seconds *in all*.

    The bound covers the whole scrape - connecting, the headers and every byte of the body - not each read: a
    server that trickles its answer (a byte a second) is cut off at the deadline. Setting ``abort`` (e.g. on
    Ctrl-C) cuts it off at once. Up to three redirects are followed within the same deadline.

    Raises:
        ScrapeError: connection refused, the deadline passed (``timeout``), aborted, HTTP status >= 400, a
            malformed HTTP answer, a body shorter than its Content-Length, or a body over 64 MiB.
    """
    deadline = time.monotonic() + timeout
    for _ in range(4):
        status, location, body = _get_once(url, deadline, abort)
        if status in (301, 302, 303, 307, 308) and location:
            url = urllib.parse.urljoin(url, location)
            check_url(url, "a redirect")
            continue
        if status >= 400:
            raise ScrapeError("http", f"{url} answered HTTP {status}")
        return body.decode("utf-8", errors="replace")
    raise ScrapeError("http", f"{url} redirected more than 3 times")


def _get_once(url: str, deadline: float, abort: threading.Event | None) -> tuple[int, str | None, bytes]:
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    left = deadline - time.monotonic()
    if left <= 0 or (abort is not None and abort.is_set()):
        raise ScrapeError("timeout", f"{url}: no time left for the scrape")
    try:
        port = parts.port
    except ValueError:
        raise ScrapeError("connect", f"{url}: the port is not a number in 1-65535") from None
    conn = cls(parts.hostname or "", port, timeout=left)
    cut = _Deadline(conn, deadline, abort)
    try:
        conn.connect()
        cut.start()
        conn.request("GET", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")),
                     headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "kv-guardian"})
        resp = conn.getresponse()
        body = bytearray()
        while len(body) <= _MAX_BODY:
            chunk = resp.read1(65536)
            if not chunk:
                break
            body += chunk
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if cut.fired:
            what = "the scrape was stopped" if abort is not None and abort.is_set() else "it did not answer in full"
            raise ScrapeError("timeout", f"{url}: {what} within the scrape timeout") from None
        if isinstance(exc, http.client.HTTPException):
            raise ScrapeError("http", f"{url}: not a valid HTTP answer ({type(exc).__name__})") from None
        raise ScrapeError("connect", f"cannot reach {url}: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        cut.cancel()
        conn.close()
    if cut.fired:
        raise ScrapeError("timeout", f"{url}: it did not answer in full within the scrape timeout")
    if len(body) > _MAX_BODY:
        raise ScrapeError("size", f"{url} returned more than {_MAX_BODY} bytes")
    if resp.length:  # bytes announced by Content-Length that never came (http.client does not say)
        raise ScrapeError("http", f"{url} sent {len(body)} of the {len(body) + resp.length} bytes it announced "
                                  "(Content-Length): the page is truncated")
    return resp.status, resp.getheader("Location"), bytes(body)


class _Deadline:
    """Shuts a connection's socket down when the deadline passes or ``abort`` is set: a blocked read returns."""

    def __init__(self, conn: http.client.HTTPConnection, deadline: float, abort: threading.Event | None) -> None:
        self._conn = conn
        self._deadline = deadline
        self._abort = abort
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvguardian-scrape-deadline", daemon=True)
        self.fired = False

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            left = self._deadline - time.monotonic()
            if left <= 0 or (self._abort is not None and self._abort.is_set()):
                self.fired = True
                sock = self._conn.sock
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            self._done.wait(min(left, 0.05))

    def cancel(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(1.0)


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
