"""kv-guardian's HTTP server: ``/metrics``, a short index at ``/``, the routes a command adds, 404 elsewhere;
bounded by construction. Every endpoint kv-guardian serves without an ASGI app runs on it.

prometheus_client's ``start_http_server`` runs a thread per connection with no read timeout, so idle clients
can stall scrapes. This server is one asyncio loop plus a small render pool, with bounded connections, header,
body and idle limits, ``slow`` routes on their own threads, and optional TLS and basic auth (`WebConfig`).
Binds 127.0.0.1 unless told otherwise. The limits one by one: docs/design/exporters.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvguardian.core.exporters.webconfig import WebConfig

__all__ = ["HTTPRequest", "Limits", "MetricsHTTPServer", "Response", "bind_fix"]

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable",
            504: "Gateway Timeout", 505: "HTTP Version Not Supported"}


def bind_fix(exc: OSError, *, port_flag: str = "", host_flag: str = "") -> str:
    """The fix for a failed bind: another port when the port is taken, else an address of this machine
    (naming the flag when the caller has one)."""
    if exc.errno == errno.EADDRINUSE:
        return "pick a free port" + (f" with {port_flag}" if port_flag else "") + " (0 picks one)"
    return ("bind an address of this machine (127.0.0.1, 0.0.0.0, or an interface's address)"
            + (f" with {host_flag}" if host_flag else ""))


@dataclass(frozen=True)
class Response:
    """What a route answers."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    extra: tuple[tuple[str, str], ...] = ()  # more headers

    @classmethod
    def json(cls, status: int, obj: object) -> Response:
        return cls(status, json.dumps(obj).encode(), "application/json")


@dataclass(frozen=True)
class HTTPRequest:
    """What a route's handler gets: the method, the path, the query (``parse_qs``) and the headers (lower-case
    names). The body, if any, was read and dropped."""

    method: str
    path: str
    query: dict[str, list[str]] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[HTTPRequest], Response]


@dataclass(frozen=True)
class _Route:
    handler: Handler
    methods: tuple[str, ...]
    slow: bool
    doc: str


@dataclass(frozen=True)
class Limits:
    """What one server spends on its clients, at most."""

    max_connections: int = 64  # open connections; the oldest still reading its request goes first
    header_timeout: float = 10.0  # seconds for a request line and headers (and a body) to arrive
    idle_timeout: float = 30.0  # seconds a kept-alive connection may wait for its next request
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 64 * 1024
    render_threads: int = 2  # threads rendering expositions and running quick routes (never the loop)
    slow_requests: int = 4  # slow routes running at once, each on its own daemon thread


#: connections the kernel queues before the loop accepts them (asyncio's default is 100): a burst beyond the queue
#: has its SYNs dropped, and each such client waits a whole TCP retransmit (1 s, then 3 s) to get in. The system's
#: cap (net.core.somaxconn, 4096 on current kernels) bounds it.
_BACKLOG = socket.SOMAXCONN


class MetricsHTTPServer:
    """Serve ``registry`` (anything prometheus_client's encoders take; None: no ``/metrics``) on ``host:port``
    from a daemon thread, with the routes added by `route`. ``title`` heads the index at ``/``."""

    title = "kv-guardian exporter"

    def __init__(self, registry: Any, host: str = "127.0.0.1", port: int = 0, limits: Limits | None = None, *,
                 web: WebConfig | None = None) -> None:
        self.registry = registry
        self.limits = limits or Limits()
        self.web = web  # a WebConfig (TLS, basic auth), or None
        self._ssl = web.ssl_context() if web is not None else None  # UsageError for a bad certificate
        self.scheme = "https" if self._ssl is not None else "http"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(_BACKLOG)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.server_address: tuple[str, int] = self._sock.getsockname()[:2]
        self._pool = ThreadPoolExecutor(self.limits.render_threads, thread_name_prefix="kvg-metrics-render")
        self._loop = asyncio.new_event_loop()
        self._waiting: OrderedDict[asyncio.Task[None], asyncio.StreamWriter] = OrderedDict()  # reading a request
        self._tasks: set[asyncio.Task[None]] = set()  # every open connection
        self._slow = 0  # slow routes running (only the loop's thread counts them)
        self._routes: dict[str, _Route] = {}
        if registry is not None:
            self.route("/metrics", self._metrics, doc="Prometheus metrics")
        self._started = threading.Event()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._serve, name="kvg-metrics-http", daemon=True)
        self._thread.start()
        self._started.wait(10)

    def route(self, path: str, handler: Handler, *, methods: tuple[str, ...] = ("GET", "HEAD"), slow: bool = False,
              doc: str = "") -> None:
        """Answer ``path`` (exactly; any query) with ``handler`` for ``methods`` (a ``HEAD`` is answered like a
        ``GET`` without its body; leave it out for a route that acts, such as a drain).
        ``handler`` runs off the loop: in the render pool, or with ``slow`` on a daemon thread of its own.
        A handler that raises answers 500. Add routes before clients know the address."""
        allowed = tuple(dict.fromkeys(methods))
        self._routes[path] = _Route(handler, allowed, slow, doc)

    # ------------------------------------------------------------------ lifecycle
    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(
                self._client, sock=self._sock, backlog=_BACKLOG, limit=self.limits.max_header_bytes, ssl=self._ssl,
                ssl_handshake_timeout=self.limits.header_timeout if self._ssl is not None else None)
            self._started.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def close(self) -> None:
        """Stop serving and close every connection (idempotent)."""
        if self._loop.is_closed() or not self._thread.is_alive():
            return

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        with contextlib.suppress(RuntimeError):  # the loop already stopped
            asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._sock.close()

    # ------------------------------------------------------------------ one connection
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        if len(self._tasks) > self.limits.max_connections and self._waiting:
            oldest, old_writer = next(iter(self._waiting.items()))
            self._waiting.pop(oldest)
            old_writer.close()
            oldest.cancel()
        try:
            await self._requests(reader, writer, task)
        except (asyncio.CancelledError, ConnectionError, OSError):
            pass
        finally:
            self._waiting.pop(task, None)
            self._tasks.discard(task)
            writer.close()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        task: asyncio.Task[None]) -> None:
        timeout = self.limits.header_timeout
        while True:
            self._waiting[task] = writer
            head = await self._read_head(reader, writer, timeout)
            self._waiting.pop(task, None)
            if head is None:
                return
            keep = await self._answer(head, reader, writer)
            if not keep:
                return
            timeout = self.limits.idle_timeout

    async def _read_head(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         timeout: float) -> bytes | None:
        try:
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        except asyncio.TimeoutError:
            return None
        except asyncio.LimitOverrunError:
            await self._send(writer, Response(431, b"request headers too large\n"), keep=False)
            return None
        except asyncio.IncompleteReadError:  # the client went away
            return None

    async def _answer(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; whether the connection stays open."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._send(writer, Response(400, b"bad request\n"), keep=False)
            return False
        method, target, version = parts
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        refused = await self._read_body(headers, reader)
        if refused is not None:
            await self._send(writer, refused, keep=False)
            return False
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        if not await self._authorized(headers.get("authorization")):
            from kvguardian.core.exporters.webconfig import REALM

            await self._send(writer, Response(401, b"unauthorized\n", extra=(("WWW-Authenticate", REALM),)),
                             keep=keep)
            return keep
        path, _, query = target.partition("?")
        request = HTTPRequest(method, path, urllib.parse.parse_qs(query), headers)
        await self._send(writer, await self._dispatch(request), keep=keep, head=method == "HEAD")
        return keep

    async def _read_body(self, headers: dict[str, str], reader: asyncio.StreamReader) -> Response | None:
        """Read and drop the request's body; the response that refuses it, or None."""
        if "transfer-encoding" in headers:
            return Response(411, b"send a Content-Length (no route takes a chunked body)\n")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            return Response(400, b"bad Content-Length\n")
        if not 0 <= length <= self.limits.max_body_bytes:
            return Response(413, b"request body too large\n")
        if length:
            try:
                await asyncio.wait_for(reader.readexactly(length), self.limits.header_timeout)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError):
                return Response(408, b"request body too slow\n")
        return None

    async def _dispatch(self, request: HTTPRequest) -> Response:
        route = self._routes.get(request.path)
        if request.path == "/" and route is None:
            route = _Route(self._index, ("GET", "HEAD"), False, "")
        if route is None:
            return Response(404, f"not found; try {' '.join(sorted(self._routes))}\n".encode())
        if request.method not in route.methods:
            allow = ", ".join(route.methods)
            return Response(405, f"use {allow}\n".encode(), extra=(("Allow", allow),))
        try:
            if not route.slow:
                return await self._loop.run_in_executor(self._pool, route.handler, request)
            return await self._run_slow(route.handler, request)
        except Exception as exc:  # a handler (or a collector) that raises: one 500, the server goes on
            return Response(500, f"error answering {request.path}: {type(exc).__name__}\n".encode())

    async def _run_slow(self, handler: Handler, request: HTTPRequest) -> Response:
        """Run ``handler`` on a thread of its own. The slot it takes is given back when the thread ends, not
        when the client goes away: clients that send a slow request and leave cannot pile up threads."""
        if self._slow >= self.limits.slow_requests:
            return Response(503, b"busy: too many slow requests at once\n", extra=(("Retry-After", "1"),))
        self._slow += 1
        done: asyncio.Future[Response] = self._loop.create_future()

        def run() -> None:
            try:
                out: Any = handler(request)
            except Exception as exc:
                out = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._slow_done, done, out)

        try:
            threading.Thread(target=run, name="kvg-http-slow", daemon=True).start()
        except BaseException:
            self._slow -= 1
            raise
        return await done

    def _slow_done(self, fut: asyncio.Future[Response], out: Response | BaseException) -> None:
        self._slow -= 1
        if fut.done():  # the connection was closed meanwhile
            return
        if isinstance(out, BaseException):
            fut.set_exception(out)
        else:
            fut.set_result(out)

    def _index(self, _request: HTTPRequest) -> Response:
        rows = [f"{path:<9} {r.doc} ({' or '.join(r.methods)})" for path, r in sorted(self._routes.items())]
        return Response(200, (f"{self.title}\n\n" + "\n".join(rows) + "\n").encode())

    async def _authorized(self, header: str | None) -> bool:
        if self.web is None or not self.web.auth:
            return True
        return bool(await self._loop.run_in_executor(self._pool, self.web.check_header, header))

    def _metrics(self, request: HTTPRequest) -> Response:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(200, encoder(self.registry), content_type)

    async def _send(self, writer: asyncio.StreamWriter, r: Response, *, keep: bool, head: bool = False) -> None:
        lines = [f"HTTP/1.1 {r.status} {_REASONS.get(r.status, '')}", f"Content-Type: {r.content_type}",
                 f"Content-Length: {len(r.body)}",
                 f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S GMT', time.gmtime())}",
                 f"Connection: {'keep-alive' if keep else 'close'}", *(f"{k}: {v}" for k, v in r.extra)]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else r.body))
        await asyncio.wait_for(writer.drain(), self.limits.idle_timeout)
