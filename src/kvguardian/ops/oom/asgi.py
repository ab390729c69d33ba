"""The in-process guard at the HTTP edge: ASGI middleware with ``/ready`` and ``/drain``.

    app = FastAPI()
    install(app, oom)                 # FastAPI / Starlette: middleware + the Overloaded -> 503 handler
    # any other ASGI app:  app = OOMMiddleware(app, oom)

``/ready`` is the readiness probe, ``/drain`` the preStop (stop admitting, wait for in-flight requests),
``/oom`` the status. Every other request goes through `OOMGuard.admit`: 503 + ``Retry-After`` while draining,
as for a handler raising `Overloaded`. The endpoints in detail: docs/design/oom.md.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, TypeVar

from kvguardian.ops.oom.guard import OOMGuard, Overloaded

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request

_App = TypeVar("_App", bound="Starlette")

__all__ = ["OOMMiddleware", "install", "overloaded_body"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def overloaded_body(exc: Overloaded) -> dict[str, Any]:
    return {"error": {"type": "overloaded", "reason": exc.reason, "message": str(exc),
                      "retry_after_s": exc.retry_after}}


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


async def _json(send: Send, status: int, body: object, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


class OOMMiddleware:
    def __init__(self, app: ASGIApp, oom: OOMGuard, *, ready_path: str = "/ready", drain_path: str = "/drain",
                 status_path: str = "/oom", exempt: tuple[str, ...] = ("/metrics",),
                 drain_deadline: float = 30.0) -> None:
        self.app = app
        self.oom = oom
        self.ready_path = ready_path
        self.drain_path = drain_path
        self.status_path = status_path
        self.exempt = exempt
        self.drain_deadline = drain_deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path == self.ready_path:
            ready = self.oom.ready
            await _json(send, 200 if ready else 503, {"ready": ready, "pressure": self.oom.pressure,
                                                       "draining": not ready, "in_flight": self.oom.in_flight,
                                                       "ready_to_stop": self.oom.ready_to_stop})
            return
        if path == self.drain_path:
            await self._drain(scope, send)
            return
        if path == self.status_path:
            await _json(send, 200, self.oom.status())
            return
        if path.startswith(self.exempt):
            await self.app(scope, receive, send)
            return
        try:
            self.oom.admit()
        except Overloaded as exc:
            retry = retry_after_header(exc.retry_after).encode()
            await _json(send, 503, overloaded_body(exc), [(b"retry-after", retry)])
            return
        self.oom.request_started()
        try:
            await self.app(scope, receive, send)
        finally:
            self.oom.request_finished()

    async def _drain(self, scope: Scope, send: Send) -> None:
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            deadline = float(query.get("deadline", [self.drain_deadline])[0])
        except ValueError:
            await _json(send, 400, {"error": {"type": "bad_request", "message": "deadline must be a number of "
                                                                                 "seconds, e.g. /drain?deadline=60"}})
            return
        # the request itself is not counted in flight: it would wait for itself
        result = await asyncio.to_thread(self.oom.drain, deadline)
        await _json(send, 200 if result["drained"] else 504, result)


def install(app: _App, oom: OOMGuard, **kwargs: Any) -> _App:
    """Guard a FastAPI or Starlette app: `OOMMiddleware` outermost and an `Overloaded` exception handler
    (a handler raising it answers 503 + Retry-After). Keyword arguments go to `OOMMiddleware`."""
    from starlette.responses import JSONResponse

    async def on_overloaded(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Overloaded)
        return JSONResponse(overloaded_body(exc), status_code=503,
                            headers={"Retry-After": retry_after_header(exc.retry_after)})

    app.add_exception_handler(Overloaded, on_overloaded)
    app.add_middleware(OOMMiddleware, oom=oom, **kwargs)
    return app
