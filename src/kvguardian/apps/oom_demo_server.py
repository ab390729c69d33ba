"""A FastAPI + uvicorn server over the paged mini engine, with and without the pre-OOM guard.

    python -m kvguardian.apps.oom_demo_server --port 8000 [--no-guard] [--interval 0.02]

``POST /generate`` takes ``keep`` (the handler keeps the request's KV for good: the leak) and ``work_mb``
(memory a request legitimately holds in flight: the overload). With the guard, the kept store is evictable
retention, and ``/ready``, ``/drain``, ``/oom`` shed load before the OOM killer would. Tokens and prompts are
never logged. Details: docs/design/apps.md.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime.
import argparse
import mmap
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from kvguardian.apps.repro.models import TinySpec

if TYPE_CHECKING:
    from kvguardian.ops.oom.guard import OOMGuard
    from kvguardian.runtime.paged import PagedKVPool

__all__ = ["SPEC", "SessionStore", "create_app", "main"]

#: 4 layers, 4 KV heads of 64: 8 KiB of KV per token (fp32), so a 512-token request keeps 4 MiB
SPEC = TinySpec(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=512, vocab=256)
MIB = 1 << 20


class SessionStore:
    """Request id -> that request's K/V (copied out of the pool when it finished). Unbounded: the bug."""

    def __init__(self) -> None:
        self.entries: OrderedDict[str, list[Any]] = OrderedDict()
        self.nbytes = 0
        self.evicted = 0
        self._lock = threading.Lock()

    def put(self, rid: str, tensors: list[Any]) -> None:
        size = sum(t.untyped_storage().nbytes() for t in tensors)
        with self._lock:
            self.entries[rid] = tensors
            self.nbytes += size

    def evict(self, need: int) -> int:
        """Drop the oldest sessions until ``need`` bytes are freed; returns the bytes freed."""
        freed = 0
        with self._lock:
            while self.entries and freed < need:
                _, tensors = self.entries.popitem(last=False)
                freed += sum(t.untyped_storage().nbytes() for t in tensors)
                self.evicted += 1
            self.nbytes -= freed
        return freed


class _Work:
    """``mb`` MiB of anonymous memory, touched page by page (so the cgroup is charged), unmapped on close."""

    def __init__(self, mb: int) -> None:
        self.buf = mmap.mmap(-1, mb * MIB) if mb > 0 else None
        if self.buf is not None:
            for off in range(0, len(self.buf), mmap.PAGESIZE):
                self.buf[off] = 1

    def close(self) -> None:
        if self.buf is not None:
            self.buf.close()


def _keeping_scheduler(pool: "PagedKVPool", store: SessionStore, keep: set[str], oom: "OOMGuard | None") -> Any:
    from kvguardian.runtime.paged.engine import OwnershipScheduler

    class KeepingScheduler(OwnershipScheduler):
        """Copies a finished request's K/V out of the pool before freeing it, when asked to keep it."""

        def finish(self, seqs: list[Any]) -> None:
            import torch

            for seq in seqs:
                if seq.rid in keep and not seq.error and len(seq.block_ids):
                    keep.discard(seq.rid)
                    if oom is not None:
                        oom.on_allocate()  # the store is about to grow: an allocation path
                    table = torch.from_numpy(seq.block_ids.astype("int64"))
                    n = seq.num_computed
                    kv = [t.clone() for layer in range(len(pool.k)) for t in pool.gather(layer, table, n)]
                    store.put(seq.rid, kv)
            super().finish(seqs)

    return KeepingScheduler(pool)


def create_app(*, guarded: bool = True, interval: float = 0.02, num_blocks: int = 512,
               retry_after: float = 1.0, seed: int = 0) -> Any:
    """The app; ``app.state`` holds ``loop``, ``store``, ``guard`` and ``oom`` (None without the guard)."""
    import torch
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry
    from pydantic import BaseModel, Field

    from kvguardian.apps.repro.models import build_llama
    from kvguardian.core.exporters.prometheus import KVGuardianCollector
    from kvguardian.core.exporters.server import mount_metrics
    from kvguardian.ops.oom.asgi import install
    from kvguardian.ops.oom.engine import guard_engine
    from kvguardian.ops.oom.guard import OOMGuard, Overloaded
    from kvguardian.ops.oom.metrics import OOMCollector
    from kvguardian.ops.oom.signals.cgroup import cgroup_signal_for_pid
    from kvguardian.runtime.guard import Guard
    from kvguardian.runtime.paged import PagedKVPool
    from kvguardian.runtime.paged.engine import Engine, Request
    from kvguardian.runtime.paged.loop import EngineLoop
    from kvguardian.runtime.paged.model import PagedLlama

    torch.set_num_threads(1)
    hf = build_llama(SPEC, seed=seed)
    model = PagedLlama(hf)
    pool = PagedKVPool(num_blocks, 16, model.spec)
    guard = Guard()
    oom = OOMGuard([cgroup_signal_for_pid("self")], interval=interval, retry_after=retry_after) if guarded else None
    store = SessionStore()
    keep: set[str] = set()
    engine = Engine(model, _keeping_scheduler(pool, store, keep, oom), max_num_seqs=8, max_batch_tokens=1024,
                    eos_token_id=hf.generation_config.eos_token_id)
    loop = EngineLoop(engine).start()
    registry = CollectorRegistry()
    registry.register(KVGuardianCollector(guard.ledger, pools={"main": pool}))
    if oom is not None:
        oom.watch_guard(guard)
        guard.retain(store, reason="conversation KV kept after the response", evict=store.evict)
        guard_engine(oom, engine)
        registry.register(OOMCollector(oom))
        oom.start()

    class GenerateIn(BaseModel):
        prompt: list[int] = Field(min_length=1, max_length=4096)
        max_new_tokens: int = Field(default=8, ge=1, le=256)
        keep: bool = False
        work_mb: int = Field(default=0, ge=0, le=1024)

    app = FastAPI(title="kv-guardian paged demo server")
    app.state.loop, app.state.store, app.state.guard, app.state.oom = loop, store, guard, oom
    counter = iter(range(1, 1 << 62))
    lock = threading.Lock()

    @app.post("/generate")
    def generate(body: GenerateIn) -> dict[str, Any]:
        with lock:
            rid = f"r-{next(counter)}"
        reservation = oom.admit(body.work_mb * MIB) if oom is not None else None  # Overloaded -> 503
        try:
            work = _Work(body.work_mb)
        finally:
            if reservation is not None:
                reservation.allocated()
        try:
            with guard.request(rid):
                if body.keep:
                    keep.add(rid)
                prompt = tuple(t % SPEC.vocab for t in body.prompt)
                seq = loop.submit(Request(rid, "demo", prompt, body.max_new_tokens)).result(timeout=300)
        finally:
            work.close()
        if seq.error:
            raise Overloaded(seq.error, retry_after=retry_after, reason="shed")
        return {"request_id": rid, "tokens": seq.output}

    @app.get("/store")
    def store_info() -> dict[str, Any]:
        return {"sessions": len(store.entries), "bytes": store.nbytes, "evicted": store.evicted}

    mount_metrics(app, registry)
    if oom is not None:
        install(app, oom)
    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m kvguardian.apps.oom_demo_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--no-guard", action="store_true", help="serve without the pre-OOM guard")
    p.add_argument("--interval", type=float, default=0.02, help="the guard's sampling interval (seconds)")
    p.add_argument("--num-blocks", type=int, default=512)
    args = p.parse_args(argv)
    app = create_app(guarded=not args.no_guard, interval=args.interval, num_blocks=args.num_blocks)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
