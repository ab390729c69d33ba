"""An OpenAI-compatible server over the paged mini engine (FastAPI): ``/v1/completions`` (streaming as
Server-Sent Events, as OpenAI and vLLM stream), ``/v1/models``, ``/health``, ``/metrics``.

    app = create_app(MiniConfig(cache_mode="per-tenant", api_keys=("acme=sk-a", "globex=sk-b")))
    uvicorn.run(app, host="127.0.0.1", port=8000)        # or: kv-guardian serve-mini

The model is a tiny random-weight Llama, so every prompt token costs a real prefill and a prefix-cache hit is
measurably faster. With the pre-OOM guard it also serves ``/ready``, ``/drain`` and ``/oom``.
Design notes: docs/design/apps.md.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request  # this module is the app: imported only when one is built
from fastapi.responses import JSONResponse, StreamingResponse

from kvguardian.apps.mini_server.config import MiniConfig
from kvguardian.apps.mini_server.tenancy import KeyRing, namespace_of
from kvguardian.core.errors import require
from kvguardian.core.exporters.webconfig import BasicAuthASGI, WebConfig, basic_user
from kvguardian.runtime.paged.loop import EngineLoop, Stopped

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from kvguardian.ops.oom.guard import OOMGuard
    from kvguardian.runtime.guard import Guard

__all__ = ["MiniConfig", "MiniServer", "create_app"]

SPECIAL = 3  # token ids 0 (pad), 1 (bos), 2 (eos); byte b is token b + 3
VOCAB = 256 + SPECIAL + 1


class MiniServer:
    """The model, pool, engine loop and key ring behind one app."""

    def __init__(self, config: MiniConfig, web: WebConfig | None = None, guard: Guard | None = None,
                 oom: OOMGuard | None = None,
                 *, oom_preempt: bool = False) -> None:
        config.validate()
        self.config = config
        self.web = web or WebConfig()
        self.keys = KeyRing.from_pairs(config.api_keys, config.keys_files)
        self.created = int(time.time())
        self.pool, engine = _build_engine(config)
        self.guard = guard
        self.oom = oom
        if oom is not None:
            from kvguardian.ops.oom.engine import guard_engine

            guard_engine(oom, engine, name="mini", preempt=oom_preempt)
        self.feed: Any = None
        if guard is not None:  # the pool's prefix-cache blocks become ledger entries (kvguardian_kv_* metrics)
            from kvguardian.runtime.paged.ledger_feed import LedgerFeed

            self.feed = LedgerFeed(guard.ledger, name="mini")
        self.loop = EngineLoop(engine, on_step=self._pump if guard is not None else None)

    def _pump(self) -> None:
        with self.loop.lock:
            self.feed.pump(self.pool)

    def metrics_registry(self) -> Any:
        """A registry with the pool's metrics and the pool's debug findings (prometheus_client)."""
        require("prometheus_client", "prometheus")
        from prometheus_client import CollectorRegistry

        from kvguardian.core.exporters.prometheus import KVGuardianCollector

        registry = CollectorRegistry(auto_describe=True)
        ledger = self.guard.ledger if self.guard is not None else None
        registry.register(KVGuardianCollector(ledger, pools={"mini": _LockedPool(self)}, findings=self._findings))
        if self.oom is not None:
            from kvguardian.ops.oom.metrics import OOMCollector

            registry.register(OOMCollector(self.oom))
        return registry

    def start(self) -> None:
        """Start the engine thread and the guard's sampling thread (idempotent)."""
        self.loop.start()
        if self.oom is not None:
            self.oom.start()

    def close(self) -> None:
        if self.oom is not None:
            self.oom.stop()
        self.loop.close()

    def retry_after(self) -> float:
        return float(self.oom.retry_after) if self.oom is not None else 1.0

    def _findings(self) -> tuple[Sequence[Any], float]:
        with self.loop.lock:
            return self.pool.faults, time.time()

    def tenant_of(self, headers: Mapping[str, str]) -> str | None:
        auth = headers.get("authorization")
        if not self.keys.required and self.web.auth:  # no API keys: basic-auth users are the tenants
            return basic_user(auth)
        return self.keys.tenant_of(auth)


class _LockedPool:
    """The pool's `metrics()` read under the engine loop's lock (a scrape never sees half a step)."""

    def __init__(self, server: MiniServer) -> None:
        self._server = server

    def metrics(self) -> dict[str, float | int]:
        with self._server.loop.lock:
            return self._server.pool.metrics()


def _build_engine(config: MiniConfig) -> tuple[Any, Any]:
    import torch

    from kvguardian.apps.repro.models import TinySpec, build_llama
    from kvguardian.runtime.paged.engine import Engine, OwnershipScheduler
    from kvguardian.runtime.paged.model import PagedLlama
    from kvguardian.runtime.paged.pool import PagedKVPool

    torch.set_num_threads(config.threads)
    spec = TinySpec(hidden=config.hidden, layers=config.layers, heads=4, kv_heads=2, intermediate=2 * config.hidden,
                    vocab=VOCAB, max_positions=config.max_model_len)
    model = PagedLlama(build_llama(spec, seed=config.seed))
    pool = PagedKVPool(config.num_blocks, config.block_size, model.spec, prefix_caching=config.cache_mode != "off",
                       debug=config.debug, scrub=config.scrub)
    engine = Engine(model, OwnershipScheduler(pool), max_num_seqs=config.max_num_seqs,
                    max_batch_tokens=config.max_batch_tokens, eos_token_id=2)
    return pool, engine


# ---------------------------------------------------------------------------------------------- requests
class BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


def encode(text: str) -> list[int]:
    return [b + SPECIAL for b in text.encode("utf-8")]


@dataclass
class Completion:
    prompt: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    salt: str | None


def parse_completion(body: Mapping[str, object], server: MiniServer) -> Completion:
    """Validate a ``/v1/completions`` body against the model and the pool.

    Raises:
        BadRequest: what is wrong, OpenAI style (status, type, param).
    """
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    cfg = server.config
    if body.get("model") not in (None, cfg.model_name):
        raise BadRequest(404, f"model {str(body.get('model'))[:64]!r} does not exist; this server has "
                         f"{cfg.model_name!r}", "NotFoundError", "model")
    prompt = _prompt_tokens(body.get("prompt"))
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest(400, "max_tokens must be a positive integer", param="max_tokens")
    if len(prompt) + max_tokens > cfg.max_model_len:
        raise BadRequest(400, f"this model's maximum context length is {cfg.max_model_len} tokens; the prompt "
                         f"has {len(prompt)} and max_tokens is {max_tokens}", param="prompt")
    if -(-(len(prompt) + max_tokens) // cfg.block_size) > cfg.num_blocks:
        raise BadRequest(400, "the request needs more KV blocks than the pool has", param="max_tokens")
    if body.get("n", 1) != 1 or body.get("echo"):
        raise BadRequest(400, "only n=1 without echo is supported", param="n")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest(400, "cache_salt must be a non-empty string", param="cache_salt")
    opts = body.get("stream_options") or {}
    return Completion(prompt, max_tokens, bool(body.get("stream")),
                      bool(isinstance(opts, dict) and opts.get("include_usage")), salt)


def _prompt_tokens(prompt: object) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        tokens = encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        tokens = list(prompt)
        if any(not 0 <= t < VOCAB for t in tokens):
            raise BadRequest(400, f"token ids must be in 0..{VOCAB - 1}", param="prompt")
    else:
        raise BadRequest(400, "prompt must be a string or a list of token ids (one prompt per request)",
                         param="prompt")
    if not tokens:
        raise BadRequest(400, "prompt is empty", param="prompt")
    return tokens


def _error(status: int, message: str, kind: str, param: str | None = None) -> Any:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status, headers=headers)


# ---------------------------------------------------------------------------------------------- the app
def create_app(config: MiniConfig | None = None, *, web: WebConfig | None = None, guard: Guard | None = None,
               oom: OOMGuard | None = None, oom_preempt: bool = False) -> Any:
    """The FastAPI app of a new `MiniServer`; its engine thread starts with the app's lifespan (or the first request).

    ``web`` adds basic auth outside ``/v1`` (``/v1`` takes API keys); a `kvguardian.Guard` gets the pool's cached
    blocks after every engine step and is exported on ``/metrics``; ``oom`` (a `kvguardian.ops.oom.OOMGuard`) wires
    the engine and the app to the pre-OOM guard, ``oom_preempt`` adding preemption as its last eviction step.
    Details: docs/design/apps.md."""
    from kvguardian.core.exporters.server import mount_metrics

    server = MiniServer(config or MiniConfig(), web, guard, oom, oom_preempt=oom_preempt)

    @contextlib.asynccontextmanager
    async def lifespan(_app: object) -> AsyncIterator[None]:
        server.start()
        try:
            yield
        finally:
            server.close()

    app = FastAPI(title="kv-guardian mini server", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.mini = server
    mount_metrics(app, server.metrics_registry())

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **server.loop.snapshot()}

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        if server.tenant_of(request.headers) is None:
            return _error(401, "invalid or missing API key", "AuthenticationError")
        return {"object": "list", "data": [{"id": server.config.model_name, "object": "model",
                                            "created": server.created, "owned_by": "kv-guardian",
                                            "max_model_len": server.config.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        tenant = server.tenant_of(request.headers)
        if tenant is None:
            return _error(401, "invalid or missing API key", "AuthenticationError")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "the body is not valid JSON", "invalid_request_error")
        try:
            comp = parse_completion(body, server)
        except BadRequest as exc:
            return _error(exc.status, str(exc), exc.kind, exc.param)
        server.start()
        stream = _Stream(server, tenant, comp)
        if comp.stream:
            first = await stream.first(request.receive)
            if first is not None:
                return first
            return _SSEResponse(stream)
        return await stream.whole()

    if oom is not None:  # inside basic auth: /drain stops the server, so it needs the credentials too
        from kvguardian.ops.oom.asgi import install

        install(app, oom, exempt=("/metrics", "/health"))
    if server.web.auth:  # /v1 has its own keys; with none configured, basic auth guards it too
        app.add_middleware(BasicAuthASGI, config=server.web,  # type: ignore[arg-type]
                           exempt=(lambda path: path.startswith("/v1/")) if server.keys.required else None)
    return app


class _Stream:
    """One completion: submitted to the engine loop, its tokens read back on the event loop."""

    def __init__(self, server: MiniServer, tenant: str, comp: Completion) -> None:
        from kvguardian.runtime.paged.engine import Request

        self.server = server
        self.comp = comp
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.queue: asyncio.Queue[tuple[int | None, bool, Stopped | None]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        shared = namespace_of(server.config.cache_mode, tenant, comp.salt)
        req = Request(self.id, tenant, tuple(comp.prompt), comp.max_tokens, shared=shared)

        def deliver(token: int | None, finished: bool, stopped: Stopped | None) -> None:  # engine thread
            loop.call_soon_threadsafe(self.queue.put_nowait, (token, finished, stopped))

        server.loop.submit(req, deliver)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.tokens = 0
        self.finished = False
        self._peeked: tuple[int | None, bool, Stopped | None] | None = None

    async def _next(self) -> tuple[int | None, bool, Stopped | None]:
        if self._peeked is not None:
            item, self._peeked = self._peeked, None
        else:
            item = await self.queue.get()
        self.finished = item[1]
        return item

    async def first(self, receive: Callable[[], Awaitable[Any]]) -> Any:
        """Wait for the first event: the error response when the request ended before its first token (503 +
        Retry-After when it was shed) or the client went away meanwhile (``receive``, the request's ASGI
        receive, says ``http.disconnect``: the request is aborted), else None (the stream can start; the event
        is kept for `sse`)."""
        nxt = asyncio.ensure_future(self._next())
        gone = asyncio.ensure_future(_disconnect(receive))
        got = False
        try:
            await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
            got = nxt.done()
        finally:  # also when cancelled (the server stops)
            for task in (nxt, gone):
                if not task.done():
                    task.cancel()
            if not got:
                self.close()
        if not got:  # nobody reads this answer
            return _error(499, "the client closed the request", "client_closed_request")
        item = nxt.result()
        if item[2] is not None:
            return self._stopped(item[2])
        self._peeked = item
        self.finished = False
        return None

    def close(self) -> None:
        """Abort the request unless it finished (the client went away): stop generating, free its blocks."""
        if not self.finished:
            self.server.loop.abort(self.id)

    def _stopped(self, stopped: Stopped) -> Any:
        if stopped.reason != "shed":
            return _error(500, stopped.message, "server_error")
        from kvguardian.ops.oom.asgi import overloaded_body, retry_after_header
        from kvguardian.ops.oom.guard import Overloaded

        retry = self.server.retry_after()
        body = overloaded_body(Overloaded(stopped.message, retry_after=retry, reason="shed"))
        return JSONResponse(body, status_code=503, headers={"Retry-After": retry_after_header(retry)})

    def _text(self, token: int | None) -> str:
        if token is None:
            return ""
        self.tokens += 1
        byte = token - SPECIAL  # the specials and the id above the bytes decode to nothing
        return self.decoder.decode(bytes([byte]) if 0 <= byte < 256 else b"")

    def _reason(self, token: int | None) -> str:
        return "stop" if token == 2 else "length"

    def _usage(self) -> dict[str, int]:
        n = len(self.comp.prompt)
        return {"prompt_tokens": n, "completion_tokens": self.tokens, "total_tokens": n + self.tokens}

    def _chunk(self, text: str, reason: str | None) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.server.config.model_name,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}

    async def sse(self) -> AsyncIterator[bytes]:
        try:
            while not self.finished:
                token, _, stopped = await self._next()
                if stopped is not None:
                    kind = "overloaded" if stopped.reason == "shed" else "server_error"
                    code = 503 if stopped.reason == "shed" else 500
                    yield _sse({"error": {"message": stopped.message, "type": kind, "code": code}})
                    break
                text = self._text(token) + (self.decoder.decode(b"", final=True) if self.finished else "")
                yield _sse(self._chunk(text, self._reason(token) if self.finished else None))
            if self.comp.include_usage:
                yield _sse({**self._chunk("", None), "choices": [], "usage": self._usage()})
            yield b"data: [DONE]\n\n"
        finally:
            self.close()  # the client went away: stop generating, free the blocks

    async def whole(self) -> Any:
        parts: list[str] = []
        token: int | None = None
        try:
            while not self.finished:
                token, _, stopped = await self._next()
                if stopped is not None:
                    return self._stopped(stopped)
                parts.append(self._text(token))
        finally:
            self.close()
        parts.append(self.decoder.decode(b"", final=True))
        out = self._chunk("".join(parts), self._reason(token))
        out["usage"] = self._usage()
        return out


class _SSEResponse(StreamingResponse):
    """The stream as Server-Sent Events. However the response ends (finished, the client gone before the body
    started or during it), the request is aborted unless it finished: a generator Starlette never started
    would run no ``finally``."""

    def __init__(self, stream: _Stream) -> None:
        super().__init__(stream.sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stream.close()


async def _disconnect(receive: Callable[[], Awaitable[Any]]) -> None:
    """Return when the client disconnects (the body was read already: the next message is the disconnect)."""
    while (await receive()).get("type") != "http.disconnect":
        await asyncio.sleep(0.05)  # a server that answers at once with empty bodies is polled, not spun


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
