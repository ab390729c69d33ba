"""A small OpenAI-compatible client for timing probes: streamed completions, time to first token, a rate
limit, and back-off on 429 that never hammers.

Standard library only (``http.client``): one keep-alive connection per API key, so connection set-up is not
part of what is timed. Credentials (keys, ``user:password@`` in the URL) never appear in messages: keys are
named by their position (``key #1``).
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError

__all__ = ["Endpoint", "ProbeError", "RateLimiter", "Timing"]

_MAX_LINE = 1 << 20


class ProbeError(UsageError):
    """The target cannot be probed as asked (one line, what and the fix); carries the exit code."""


@dataclass
class Timing:
    ttft: float  # seconds from sending the request to the first streamed completion event
    total: float
    prompt_tokens: int | None


class RateLimiter:
    """At most ``rate`` requests per second (evenly spaced); `pause` pushes the next slot out (429)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not rate > 0:
            raise UsageError(f"--max-rps must be > 0, got {rate!r}")
        self.interval = 1.0 / rate
        self._next = 0.0
        self._clock, self._sleep = clock, sleep

    def wait(self) -> None:
        now = self._clock()
        if now < self._next:
            self._sleep(self._next - now)
            now = self._next
        self._next = now + self.interval

    def pause(self, seconds: float) -> None:
        self._next = max(self._next, self._clock() + seconds)


def safe_url(url: str) -> str:
    """``url`` without user info, query or fragment (for messages and reports)."""
    p = urllib.parse.urlsplit(url)
    host = p.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{p.scheme}://{host}{':' + str(p.port) if p.port else ''}{p.path}"


class Endpoint:
    """An OpenAI-compatible server at ``url`` (``http(s)://HOST:PORT[/v1]``)."""

    def __init__(self, url: str, *, timeout: float = 30.0, cacert: str | None = None, max_rps: float = 10.0,
                 max_retries: int = 5, sleep: Callable[[float], None] = time.sleep) -> None:
        p = urllib.parse.urlsplit(url)
        if p.scheme not in ("http", "https") or not p.hostname:
            raise ProbeError(f"--url {safe_url(url)!r} is not an http(s) URL; fix: --url http://127.0.0.1:8000")
        try:
            p.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            raise ProbeError(f"--url {safe_url(url)!r} has an invalid port") from None
        self.url = safe_url(url)
        self.scheme, self.host, self.port = p.scheme, p.hostname, p.port or (443 if p.scheme == "https" else 80)
        path = p.path.rstrip("/")
        self.base = path[:-3] if path.endswith("/v1") else path
        self.timeout = timeout
        self.ctx = ssl.create_default_context(cafile=cacert) if p.scheme == "https" else None
        self.limiter = RateLimiter(max_rps)
        self.max_retries = max_retries
        self._sleep = sleep
        self._conns: dict[int, http.client.HTTPConnection] = {}
        self.requests = 0
        self.throttled = 0  # 429 answers seen

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    # ------------------------------------------------------------------ transport
    def _conn(self, slot: int) -> http.client.HTTPConnection:
        c = self._conns.get(slot)
        if c is None:
            if self.ctx is not None:
                c = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.ctx)
            else:
                c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            c.connect()
            # the request goes out in one segment; without this, Nagle holds it behind the previous
            # response's delayed ACK on a keep-alive connection (~40 ms on Linux, a floor under every TTFT)
            c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns[slot] = c
        return c

    def _send(self, slot: int, method: str, path: str, key: str | None,
              body: dict[str, Any] | None) -> tuple[http.client.HTTPResponse, float]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(2):  # a keep-alive connection the server closed: reconnect once
            try:
                c = self._conn(slot)
                self.limiter.wait()
                t0 = time.perf_counter()
                c.request(method, self.base + path, body=data, headers=headers)
                self.requests += 1
                return c.getresponse(), t0
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest) as exc:
                self._drop(slot)
                if attempt or isinstance(exc, ConnectionRefusedError):
                    raise self._unreachable(exc) from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop(slot)
                raise self._unreachable(exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _drop(self, slot: int) -> None:
        c = self._conns.pop(slot, None)
        if c is not None:
            c.close()

    def _unreachable(self, exc: BaseException) -> ProbeError:
        why = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else (
            getattr(exc, "strerror", None) or type(exc).__name__)
        if isinstance(exc, ssl.SSLError):
            why = f"TLS: {exc.reason or exc}"
        return ProbeError(f"cannot talk to {self.url}: {why}; fix: check --url, that the server runs"
                          + (" and --cacert" if self.ctx else ""), exit_code=EXIT_ENVIRONMENT)

    def request_json(self, slot: int, method: str, path: str, key: str | None,
                     body: dict[str, Any] | None = None, *, who: str = "") -> Any:
        """A JSON request with the 429 back-off; raises `ProbeError` for refused keys and non-JSON answers."""
        for attempt in range(self.max_retries + 1):
            resp, _ = self._send(slot, method, path, key, body)
            raw = resp.read(_MAX_LINE)
            if resp.status == 429 and attempt < self.max_retries:
                self._back_off(resp, attempt)
                continue
            self._check_status(resp, raw, path, who)
            try:
                return json.loads(raw)
            except ValueError:
                raise ProbeError(f"{self.url}{path} answered {resp.status} with something that is not JSON "
                                 f"({_ctype(resp)}); it is not an OpenAI-compatible API") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _back_off(self, resp: http.client.HTTPResponse, attempt: int) -> None:
        self.throttled += 1
        retry = resp.getheader("Retry-After") or ""
        try:
            delay = min(float(retry), 60.0)
        except ValueError:
            delay = min(2.0 ** attempt, 30.0) * (1 + random.random() / 4)
        self.limiter.pause(delay)

    def _check_status(self, resp: http.client.HTTPResponse, raw: bytes, path: str, who: str) -> None:
        if resp.status in (401, 403):
            raise ProbeError(f"{who or 'the request'} was refused by {self.url} ({resp.status}); fix: pass a valid "
                             "API key with --key (keys are never printed)")
        if resp.status == 429:
            raise ProbeError(f"{self.url} kept answering 429 (rate limited) after {self.max_retries} back-offs; "
                             "fix: lower --max-rps or probe later", exit_code=EXIT_ENVIRONMENT)
        if resp.status == 404 and path.endswith("/models"):
            raise ProbeError(f"{self.url}: GET /v1/models answered 404; it is not an OpenAI-compatible API "
                             "(fix: --url should be the server's base, e.g. http://HOST:8000)")
        if resp.status >= 400:
            message = _error_message(raw)
            raise ProbeError(f"{self.url}{path} answered {resp.status}" + (f": {message}" if message else ""),
                             exit_code=EXIT_ENVIRONMENT if resp.status >= 500 else 2)

    # ------------------------------------------------------------------ the timed request
    def stream_completion(self, slot: int, key: str | None, body: dict[str, Any], *, who: str) -> Timing | None:
        """Send a streamed completion; time its first event. None when the server answered 429 (the caller
        discards the round; the limiter already waits out the back-off)."""
        resp, t0 = self._send(slot, "POST", "/v1/completions", key, {**body, "stream": True})
        if resp.status == 429:
            resp.read(_MAX_LINE)
            self._back_off(resp, self.throttled)
            return None
        if resp.status != 200:
            self._check_status(resp, resp.read(_MAX_LINE), "/v1/completions", who)
        if "text/event-stream" not in _ctype(resp):
            resp.read(_MAX_LINE)
            raise ProbeError(f"{self.url} does not stream: POST /v1/completions with \"stream\": true answered "
                             f"{_ctype(resp) or 'no content type'}, not text/event-stream; a time-to-first-token "
                             "probe needs streaming")
        first: float | None = None
        usage: int | None = None
        while True:
            line = resp.readline(_MAX_LINE)
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            event = _json_or_none(payload)
            if first is None and isinstance(event, dict) and event.get("choices"):
                first = time.perf_counter()
            if isinstance(event, dict) and isinstance(event.get("usage"), dict):
                usage = event["usage"].get("prompt_tokens")
            if isinstance(event, dict) and "error" in event:
                break
        end = time.perf_counter()
        resp.read()
        if first is None:
            raise ProbeError(f"{self.url} streamed no completion event (no 'data:' line with choices); it does "
                             "not stream as OpenAI does")
        return Timing(first - t0, end - t0, usage)


def _ctype(resp: http.client.HTTPResponse) -> str:
    return (resp.getheader("Content-Type") or "").split(";")[0].strip()


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _error_message(raw: bytes) -> str:
    data = _json_or_none(raw)
    msg = data.get("error", {}).get("message") if isinstance(data, dict) and isinstance(data.get("error"), dict) \
        else None
    return printable(str(msg))[:200] if msg else ""


def printable(text: str) -> str:
    """``text`` with control characters escaped (server replies are data, never terminal commands)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
