"""Serving the collector: in-process (`start_exporter`), inside a FastAPI/Starlette app (`mount_metrics`,
`MetricsApp`), or standalone (``kv-guardian exporter``). Everything binds 127.0.0.1 unless told otherwise.

Why not ``app.mount("/metrics", prometheus_client.make_asgi_app())``: Starlette's ``Mount`` answers
``GET /metrics`` with a 307 redirect to ``/metrics/`` (tests/integration/core/exporters/test_exporter_server.py
shows it), and some scrapers do not follow it. `mount_metrics` adds an exact ``Route`` instead, so ``/metrics``
answers 200 directly.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError
from kvguardian.core.exporters.http import MetricsHTTPServer, bind_fix
from kvguardian.core.exporters.prometheus import KVGuardianCollector
from kvguardian.core.exporters.webconfig import WebConfig
from kvguardian.core.findings import Report
from kvguardian.core.ledger import Ledger

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "Exporter", "MetricsApp", "mount_metrics", "start_exporter"]

log = logging.getLogger("kvguardian")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464



class Checked(Protocol):
    """What the exporter needs of a `kvguardian.Guard`: its ledger, and a check that returns a report."""

    @property
    def ledger(self) -> Ledger: ...

    def check(self, *, holder_chains: bool = True, end_implicit: bool = False) -> Report: ...


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class MetricsApp:
    """An ASGI app that answers every HTTP GET/HEAD with the registry's exposition (no redirects).

    The exposition is rendered in a worker thread, so a scrape never blocks the event loop of the app it is
    mounted in. Mount it with `mount_metrics` (an exact route), or run it alone under any ASGI server.
    """

    def __init__(self, registry: Collector) -> None:
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # standalone under uvicorn: nothing to start or stop
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope.get("method", "GET") not in ("GET", "HEAD"):
            await _respond(send, 405, b"text/plain; charset=utf-8", b"use GET\n", extra=[(b"allow", b"GET, HEAD")])
            return
        accept = ",".join(v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"accept")
        encoder, content_type = choose_encoder(accept)
        body = await asyncio.get_running_loop().run_in_executor(None, encoder, self.registry)
        await _respond(send, 200, content_type.encode(), b"" if scope.get("method") == "HEAD" else body)


async def _respond(send: Send, status: int, content_type: bytes, body: bytes,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def mount_metrics(app: Any, registry: Collector, path: str = "/metrics") -> MetricsApp:
    """Serve ``registry`` at exactly ``path`` of a FastAPI/Starlette ``app`` (no 307 to ``path + '/'``).

    Raises:
        UsageError: ``path`` does not start with '/' or ends with one.
    """
    if not path.startswith("/") or (len(path) > 1 and path.endswith("/")):
        raise UsageError(f"metrics path {path!r} must start with '/' and not end with one; e.g. '/metrics'")
    metrics_app = MetricsApp(registry)
    # A callable object (not a function) makes Starlette pass the raw ASGI scope through to it.
    app.add_route(path, metrics_app, methods=["GET", "HEAD"], include_in_schema=False)
    return metrics_app


class Exporter:
    """A running in-process exporter: its HTTP server, collector and (optional) periodic check thread."""

    def __init__(self, collector: Collector, registry: CollectorRegistry, server: MetricsHTTPServer,
                 checker: _Checker | None) -> None:
        self.collector = collector
        self.registry = registry
        self._server: MetricsHTTPServer | None = server
        self._checker = checker
        host, port = server.server_address[:2]
        self.host: str = host
        self.port: int = int(port)
        self.scheme = server.scheme  # "https" when served with a web config's TLS

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop the checks and the HTTP server (idempotent)."""
        if self._checker is not None:
            self._checker.stop()
            self._checker = None
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Exporter {self.url}>"


class _Checker:
    """Runs ``guard.check(holder_chains=False)`` every ``interval`` seconds and publishes the report."""

    def __init__(self, guard: Checked, collector: KVGuardianCollector, interval: float) -> None:
        self._guard = guard
        self._collector = collector
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvguardian-exporter-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._collector.publish(self._guard.check(holder_chains=False), checked_at=time.time())
            except Exception as exc:  # fail-open: the program being watched must not notice
                self._collector.note_source_error("findings", exc)
            self._stop.wait(self._interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def start_exporter(
    guard: Checked | None = None,
    *,
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    check_interval: float | None = 60.0,
    collector: Collector | None = None,
    registry: CollectorRegistry | None = None,
    web_config: WebConfig | None = None,
) -> Exporter:
    """Serve kv-guardian's metrics from inside a running program, on ``http://host:port/metrics``.

    Pass exactly one of ``guard`` (its ledger is exported, and a check every ``check_interval`` seconds refreshes
    the findings; None: only what you publish) and ``collector``. ``port`` 0 picks a free one
    (``exporter.port``); ``host`` is 127.0.0.1 unless told otherwise; ``registry`` a fresh one by default;
    ``web_config`` adds TLS and basic auth.

    Raises:
        UsageError: not exactly one of ``guard`` and ``collector``, a bad interval, or the port cannot be bound.
    """
    if (guard is None) == (collector is None):
        raise UsageError("start_exporter needs a guard or a collector (not both); fix: start_exporter(guard)")
    if check_interval is not None and check_interval <= 0:
        raise UsageError(f"check_interval must be > 0 seconds or None, got {check_interval!r}")
    checked: KVGuardianCollector | None = None
    if collector is None:
        collector = checked = KVGuardianCollector(ledger=guard.ledger)  # type: ignore[union-attr]  # one of the two
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    registry.register(collector)
    try:
        server = MetricsHTTPServer(registry, host, port, web=web_config)
    except UsageError:
        registry.unregister(collector)
        raise
    except OSError as exc:
        registry.unregister(collector)
        raise UsageError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; fix: {bind_fix(exc)}",
                         exit_code=EXIT_ENVIRONMENT) from None
    checker = (_Checker(guard, checked, check_interval)  # type: ignore[arg-type]  # checked: the guard's
               if checked is not None and check_interval else None)
    return Exporter(collector, registry, server, checker)
