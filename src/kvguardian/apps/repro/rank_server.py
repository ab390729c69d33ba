"""One rank of the §2.4 reproduction's 2-rank multimodal server, and the launcher of the two processes.

Rank 0 owns the vision tower: it encodes each image and broadcasts the visual tokens (or, in the broadcast
variant, the visual-token K/V of every layer). Every rank prefills and decodes with its own replica of the
decoder, keeps its own guard, and reports per-sequence KV in its ledger. See `kvguardian.apps.repro.multimodal`.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import queue as queue_mod
import socket
import statistics
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from kvguardian.apps.repro.vlm import VLM_TINY, VlmSpec, build_vlm, image_features
from kvguardian.core.errors import InternalError

if TYPE_CHECKING:
    import torch
    from transformers import LlavaForConditionalGeneration

    from kvguardian.runtime.guard import Guard

__all__ = ["RANK_SERVER", "VARIANTS", "WORLD", "RankServer", "VisualKVStore", "launch"]

VARIANTS = ("buggy", "broadcast", "refcount")
WORLD = 2
PROMPT = (1, 5, 9, 3)

#: The rank's running server, as a real worker keeps its engine: a module global (so holder chains start here).
RANK_SERVER: Any = None


class VisualKVStore:
    """One rank's visual-token KV: per-sequence references, and (on the vision rank) an image reuse cache."""

    def __init__(self) -> None:
        self.by_sequence: dict[str, tuple[str, list[tuple[Any, Any]]]] = {}  # seq -> (image key, per-layer K/V)
        self.image_cache: dict[str, list[tuple[Any, Any]]] = {}  # image key -> per-layer K/V (reuse)

    def put(self, seq: str, image: str, kv: list[tuple[Any, Any]]) -> None:
        self.by_sequence[seq] = (image, kv)

    def release(self, seq: str) -> str:
        """Drop the sequence's reference; return its image key."""
        image, _ = self.by_sequence.pop(seq)
        return image

    def users(self, image: str) -> int:
        return sum(1 for img, _ in self.by_sequence.values() if img == image)


class RankServer:
    """One rank of the 2-rank server. ``variant`` is one of VARIANTS."""

    def __init__(self, model: LlavaForConditionalGeneration, guard: Guard, rank: int, variant: str,
                 spec: VlmSpec) -> None:
        self.model = model
        self.guard = guard
        self.rank = rank
        self.variant = variant
        self.spec = spec
        self.store = VisualKVStore()
        if variant == "refcount":
            guard.retain(self.store, reason="image KV reuse cache, released by the all-reduced ref count")
        self.comm_bytes = 0
        self.comm_seconds = 0.0
        self.pattern: list[tuple[str, tuple[int, ...], Any]] = []  # one sequence's collectives, for `replay`
        self._recording = True

    # -- collectives, counted ----------------------------------------------------------------------------------
    def _broadcast(self, t: torch.Tensor, *, staged: bool = False) -> None:
        """Broadcast rank 0's ``t`` into every rank's ``t``. ``staged``: rank 0 sends a copy (a staging buffer),
        for KV its guard tracks: gloo drops its reference to the tensor it was given after this returns, in its
        worker thread, so the tracked storage itself must not go to gloo (see `_ended_bytes`)."""
        import torch.distributed as dist

        buf = t.clone() if staged and self.rank == 0 else t
        t0 = time.perf_counter()
        dist.broadcast(buf, src=0)
        self.comm_seconds += time.perf_counter() - t0
        del buf  # a staged copy lives on in gloo's worker for a while: untracked
        self.comm_bytes += t.numel() * t.element_size()
        if self._recording:
            self.pattern.append(("broadcast", tuple(t.shape), t.dtype))

    def _all_reduce(self, t: torch.Tensor) -> None:
        import torch.distributed as dist

        t0 = time.perf_counter()
        dist.all_reduce(t)
        self.comm_seconds += time.perf_counter() - t0
        self.comm_bytes += t.numel() * t.element_size()
        if self._recording:
            self.pattern.append(("all_reduce", tuple(t.shape), t.dtype))

    def replay(self, repeats: int = 50) -> float:
        """Median seconds of one sequence's collectives alone (same ops and sizes), ranks lined up by a barrier
        first: the communication latency per sequence, without the wait for a slower rank's compute."""
        import torch
        import torch.distributed as dist

        tensors = [(op, torch.zeros(shape, dtype=dtype)) for op, shape, dtype in self.pattern]
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            for op, t in tensors:
                if op == "broadcast":
                    dist.broadcast(t, src=0)
                else:
                    dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    # -- one sequence ------------------------------------------------------------------------------------------
    def _pixels(self, image_seed: int) -> Any:
        import torch

        g = torch.Generator().manual_seed(image_seed)
        return torch.randn(1, 3, self.spec.image_size, self.spec.image_size, generator=g)

    def _visual_prefix(self, seq: str, image: str, image_seed: int) -> Any:
        """The sequence's cache holding the visual tokens' KV, per the variant."""
        import torch
        from transformers import DynamicCache

        from kvguardian.runtime.hf.compat import output_cache

        spec = self.spec
        if self.variant == "broadcast":
            if self.rank == 0:
                feats = image_features(self.model, self._pixels(image_seed))
                cache = output_cache(self.model(inputs_embeds=feats[None], use_cache=True))
                for layer in cache.layers:
                    self._broadcast(layer.keys, staged=True)
                    self._broadcast(layer.values, staged=True)
                return cache
            cache = DynamicCache(config=self.model.config)
            for i in range(spec.layers):
                k = torch.empty(1, spec.kv_heads, spec.visual_tokens, spec.head_dim)  # k, v: [B, H_kv, S, D]
                v = torch.empty_like(k)
                self._broadcast(k)  # k, v are buffers: the cache's update copies them (DynamicLayer's cat)
                self._broadcast(v)
                cache.update(k, v, i)
                got: Any = cache.layers[i]
                self.guard.track(got.keys, got.values, layer=i, source="broadcast")
            return cache
        # buggy and refcount: rank 0 encodes the image and broadcasts the visual tokens; every rank prefills
        if self.rank == 0:
            feats = image_features(self.model, self._pixels(image_seed)).contiguous()
        else:
            feats = torch.empty(spec.visual_tokens, spec.hidden)
        self._broadcast(feats)
        cache = output_cache(self.model(inputs_embeds=feats[None], use_cache=True))
        visual = [(layer.keys, layer.values) for layer in cache.layers]
        self.store.put(seq, image, visual)
        if self.rank == 0:  # the vision rank keeps the image's KV for reuse by later sequences
            self.store.image_cache[image] = visual
        return cache

    def _end_sequence(self, seq: str) -> None:
        import torch

        if self.variant == "broadcast":
            return
        image = self.store.release(seq)
        if self.variant == "buggy":
            return  # the bug: rank 0's image_cache entry is never released
        count = torch.tensor([self.store.users(image)], dtype=torch.int64)
        self._all_reduce(count)  # live users of this image's KV on all ranks
        if int(count.item()) == 0:
            self.store.image_cache.pop(image, None)

    def run_sequence(self, seq: str, image_seed: int, new_tokens: int) -> dict[str, float]:
        import torch

        from kvguardian.runtime.hf.compat import cache_kwarg

        t0 = time.perf_counter()
        b0, s0 = self.comm_bytes, self.comm_seconds
        image = f"img-{image_seed}"
        kw = cache_kwarg()
        with self.guard.request(seq), torch.no_grad():
            cache = self._visual_prefix(seq, image, image_seed)
            ids = torch.tensor([PROMPT])
            for _ in range(new_tokens + 1):
                out = self.model(input_ids=ids, use_cache=True, **{kw: cache})
                ids = out.logits[:, -1:].argmax(-1)
                del out
            del cache
            self._end_sequence(seq)
        self._recording = False
        return {"seconds": time.perf_counter() - t0, "comm_bytes": self.comm_bytes - b0,
                "comm_seconds": self.comm_seconds - s0}


def _ended_bytes(guard: Guard, *, settle: bool = True) -> tuple[int, int]:
    """(bytes, storages) of KV whose owner sequence has ended, on this rank.

    Exact without a GC pass: gloo (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, ``runLoop``) drops its
    reference to a broadcast tensor in its worker thread after ``wait()`` returns, so a tracked storage handed
    to it could die after its sequence ended (the 8,192 bytes once seen on rank 0, under load); rank 0 therefore
    broadcasts a staging copy (`RankServer._broadcast`). tests/unit/repro/test_rank_server_gloo.py shows both.
    ``settle`` (a GC pass first) stays as a margin.
    """
    from kvguardian.core.ledger import EntryState

    if settle:
        guard.settle()
    snap = guard.snapshot()
    recs = [r for r in snap.records if r.state is not EntryState.LIVE]
    return sum(r.storage_bytes for r in recs), len(recs)


@dataclass(frozen=True)
class RankJob:
    """What every rank runs: the variants, the model spec and the workload (picklable, for spawn)."""

    variants: tuple[str, ...]
    spec: VlmSpec
    sequences: int
    new_tokens: int


def _run_variant(model: LlavaForConditionalGeneration, rank: int, variant: str, job: RankJob) -> dict[str, Any]:
    from kvguardian.runtime.guard import Guard
    from kvguardian.runtime.ranks import check_ranks

    global RANK_SERVER
    guard = Guard()
    guard.attach(model)
    try:
        RANK_SERVER = RankServer(model, guard, rank, variant, job.spec)
        per_seq = []
        held = []
        for i in range(job.sequences):
            per_seq.append(RANK_SERVER.run_sequence(f"seq-{i}", image_seed=1000 + i, new_tokens=job.new_tokens))
            held.append(_ended_bytes(guard))
        replay = RANK_SERVER.replay()
        collectives = len(RANK_SERVER.pattern)
        local = guard.check()  # settles (gc), then this rank's detectors, holder chains included
        t0 = time.perf_counter()
        ranks_report = check_ranks(guard, exact_bytes=True, settle=False)  # settled just above
        check_seconds = time.perf_counter() - t0
    finally:
        guard.detach()
        RANK_SERVER = None
    orphans = local.by_id("KVG102")
    return {
        "rank": rank,
        "sequences": per_seq,
        "held_bytes": [b for b, _ in held],
        "held_storages": [n for _, n in held],
        "kvg106": [f.to_dict() for f in ranks_report.by_id("KVG106")],
        "ranks_summary": ranks_report.summary,
        "check_seconds": check_seconds,
        "replay_seconds": replay,
        "collectives_per_sequence": collectives,
        "local_findings": {k: len(local.by_id(k)) for k in sorted(local.ids())},
        "holder_chain": orphans[0].holder_chain if orphans else None,
    }


def _worker(rank: int, port: int, job: RankJob, out: Any) -> None:
    """One rank: join the gloo group, run every variant, send the results (or the error) to the parent."""
    import torch
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=120))
        model = build_vlm(job.spec, seed=0)  # the same weights on every rank
        setup = time.perf_counter() - t0
        results = {v: _run_variant(model, rank, v, job) for v in job.variants}
        gc.collect()
        out.put({"rank": rank, "setup_seconds": setup, "variants": results})
    except BaseException as exc:  # the parent must hear about it, whatever it is
        out.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(*, variants: tuple[str, ...] = VARIANTS, spec: VlmSpec = VLM_TINY, sequences: int = 8,
           new_tokens: int = 8, timeout: float = 300.0) -> list[dict[str, Any]]:
    """Start 2 processes (fork where available: no second import of torch), gather each rank's results."""
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    if method == "fork":  # import once here, so the two ranks share it instead of importing it side by side
        import torch.distributed  # noqa: F401
        import transformers.models.llava.modeling_llava  # noqa: F401
    ctx: Any = mp.get_context(method)
    out = ctx.Queue()
    port = _free_port()
    job = RankJob(variants, spec, sequences, new_tokens)
    procs = [ctx.Process(target=_worker, args=(r, port, job, out), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(results) < WORLD:
            try:
                results.append(out.get(timeout=max(0.1, min(5.0, deadline - time.monotonic()))))
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    why = f"rank process exited with {dead[0].exitcode}" if dead else f"no result in {timeout:.0f} s"
                    raise InternalError(f"the 2-rank run failed: {why}") from None
        errors = [r for r in results if "error" in r]
        if errors:
            raise InternalError(f"rank {errors[0]['rank']} failed: {errors[0]['error']}\n{errors[0]['traceback']}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return sorted(results, key=lambda r: r["rank"])
