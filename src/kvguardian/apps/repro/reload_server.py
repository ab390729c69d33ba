"""A small LLM server with hot reload (FastAPI + uvicorn), in a buggy and a fixed variant (article §2.5).

Endpoints: ``POST /generate`` (greedy tokens; the system prompt's KV is reused), ``POST /reload`` (new random
weights: a new model generation), ``GET /kv`` (KV bytes alive per generation) and ``GET /check`` (the guard's
report). The buggy service memoises prefixes with ``functools.lru_cache`` on a method (flake8-bugbear B019), so
old services stay alive; the fixed one keeps a bounded store on the instance. Details: docs/design/repro.md.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations at runtime, and the
# request models are local to `create_app`.
import contextlib
import copy
import functools
import gc
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kvguardian.apps.repro.models import TINY, TinySpec, build_llama

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

    from kvguardian.runtime.guard import Guard

__all__ = ["VARIANTS", "create_app", "serve"]

VARIANTS = ("buggy", "fixed")
PREFIX_LIMIT = 8


def _ids(text: str, vocab: int) -> list[int]:
    """A toy tokenizer: one id per character (never logged)."""
    return [1 + ord(c) % (vocab - 1) for c in text] or [1]


class _Service:
    """Generation with a reusable system-prompt prefix; subclasses decide where prefixes live."""

    def __init__(self, model: "LlamaForCausalLM", guard: "Guard") -> None:
        self.model = model
        self.guard = guard

    def _encode(self, system: str) -> Any:
        import torch

        from kvguardian.runtime.hf.compat import output_cache

        ids = torch.tensor([_ids(system, self.model.config.vocab_size)])
        with torch.no_grad():
            return output_cache(self.model(input_ids=ids, use_cache=True))

    def encode_prefix(self, system: str) -> Any:
        raise NotImplementedError

    def generate(self, system: str, prompt: str, max_new_tokens: int) -> list[int]:
        import torch

        from kvguardian.runtime.hf.compat import cache_kwarg

        cache = copy.deepcopy(self.encode_prefix(system))  # the shared prefix is never written to
        kw = cache_kwarg()
        ids = torch.tensor([_ids(prompt, self.model.config.vocab_size)])
        out_tokens: list[int] = []
        with torch.no_grad():
            for _ in range(max_new_tokens):
                out = self.model(input_ids=ids, use_cache=True, **{kw: cache})
                ids = out.logits[:, -1:].argmax(-1)
                del out
                out_tokens.append(int(ids))
        return out_tokens


class LruPrefixService(_Service):
    """The leak: ``lru_cache`` on a method. Its cache lives on the class; every key holds ``self``."""

    @functools.lru_cache(maxsize=128)  # noqa: B019 - the bug this reproduction is about
    def encode_prefix(self, system: str) -> Any:
        cache = self._encode(system)
        self.guard.retain(cache, reason="system-prompt prefix cache (lru_cache, 128 entries)")
        return cache


class PrefixStore:
    """A bounded LRU of prefix caches, owned by one service instance."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.entries: OrderedDict[str, Any] = OrderedDict()


class InstancePrefixService(_Service):
    """The fix: the prefix store belongs to the instance and dies with it at reload."""

    def __init__(self, model: "LlamaForCausalLM", guard: "Guard") -> None:
        super().__init__(model, guard)
        self.prefixes = PrefixStore(PREFIX_LIMIT)
        guard.retain(self.prefixes, reason=f"system-prompt prefix cache (per model, {PREFIX_LIMIT} entries)")

    def encode_prefix(self, system: str) -> Any:
        store = self.prefixes.entries
        cache = store.get(system)
        if cache is None:
            cache = store[system] = self._encode(system)
            while len(store) > self.prefixes.limit:
                store.popitem(last=False)
        store.move_to_end(system)
        return cache


class ServerState:
    """What the app holds: the guard, the current service, and weak references to every model loaded."""

    def __init__(self, variant: str, spec: TinySpec, guard: "Guard") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
        self.variant = variant
        self.spec = spec
        self.guard = guard
        self.lock = threading.Lock()
        self.models: list[weakref.ref[Any]] = []
        self.requests = 0
        self.service: _Service = self._load(seed=0)

    def _load(self, seed: int) -> _Service:
        model = build_llama(self.spec, seed=seed)
        self.guard.attach(model)
        self.models.append(weakref.ref(model))
        cls = LruPrefixService if self.variant == "buggy" else InstancePrefixService
        return cls(model, self.guard)

    def reload(self, seed: int) -> int:
        with self.lock:
            self.guard.detach()  # unhook the old model
            generation = self.guard.new_generation()
            self.service = self._load(seed)
            return generation

    def kv(self, settle: bool = True) -> dict[str, Any]:
        if settle:
            gc.collect()
        snap = self.guard.snapshot()
        by_gen: dict[int, int] = {}
        for r in snap.records:
            by_gen[r.generation] = by_gen.get(r.generation, 0) + r.storage_bytes
        return {
            "generation": snap.generation,
            "kv_bytes": snap.total_bytes(),
            "entries": len(snap.records),
            "kv_bytes_by_generation": {str(g): b for g, b in sorted(by_gen.items())},
            "models_alive": sum(1 for ref in self.models if ref() is not None),
            "requests": self.requests,
        }


def create_app(variant: str, *, spec: TinySpec = TINY, guard: "Guard | None" = None) -> Any:
    """The FastAPI app of one server variant (``buggy`` or ``fixed``); ``app.state.server`` is its state."""
    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel, Field

    from kvguardian.runtime.guard import Guard

    # /check is a diagnostic endpoint: give the holder-chain search more time than the 3 s default, since the
    # process holds torch, transformers and the web stack (every search level scans every object)
    state = ServerState(variant, spec, guard if guard is not None else Guard(holder_search_seconds=20.0))

    class GenerateIn(BaseModel):
        system: str = Field(min_length=1, max_length=512)
        prompt: str = Field(min_length=1, max_length=2048)
        max_new_tokens: int = Field(default=8, ge=1, le=64)

    class ReloadIn(BaseModel):
        seed: int = Field(ge=0)

    app = FastAPI(title=f"kv-guardian hot-reload demo ({variant})")
    app.state.server = state

    @app.post("/generate")
    def generate(body: GenerateIn) -> dict[str, Any]:
        with state.lock:
            state.requests += 1
            rid = f"r-{state.requests}"
            service = state.service
            with state.guard.request(rid):
                tokens = service.generate(body.system, body.prompt, body.max_new_tokens)
            return {"request_id": rid, "generation": state.guard.ledger.generation, "tokens": tokens}

    @app.post("/reload")
    def reload(body: ReloadIn) -> dict[str, Any]:
        t0 = time.perf_counter()
        generation = state.reload(body.seed)
        return {"generation": generation, "seconds": round(time.perf_counter() - t0, 4)}

    @app.get("/kv")
    def kv(settle: bool = True) -> dict[str, Any]:
        with state.lock:
            return state.kv(settle)

    @app.get("/check")
    def check() -> dict[str, Any]:
        with state.lock:
            try:
                report = state.guard.check()
            except Exception as exc:  # pragma: no cover - reported, never a 500 with a traceback
                raise HTTPException(status_code=500, detail=f"check failed: {type(exc).__name__}") from None
            return report.to_dict()

    return app


@contextlib.contextmanager
def serve(app: Any, *, host: str = "127.0.0.1", timeout: float = 30.0) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread on a free loopback port; yield its base URL; stop it on exit."""
    from kvguardian.core.exporters.webconfig import serve_asgi

    with serve_asgi(app, host=host, timeout=timeout) as url:
        yield url
