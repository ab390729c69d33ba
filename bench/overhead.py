"""Decode throughput with and without the guard, in the same run, and `kv-guardian run` start-up overhead.

For each model config (tiny: 2 layers, hidden 64; small: 8 layers, hidden 512) and each cache class
(DynamicCache, StaticCache, QuantizedCache fp8), it runs ``generate(max_new_tokens=N, min_new_tokens=N)``
in interleaved pairs - unguarded, guarded, guarded, unguarded, ... (ABBA, so drift cancels) - and reports
tokens/s by CPU time of this process (robust on a shared machine) and by wall time, and the guarded/
unguarded ratio as the median over pairs. "Unguarded" means the cache patch is uninstalled, not idle.

It also times the hooks themselves (a separate guarded pass with a timer around the tracker's per-forward
call, over every layer update the forwards made - observed, or only counted by decode-step sampling,
``--decode-stride``, `kvguardian.runtime.hf.sampling`) as a share of decode time, and `kv-guardian run` start-up:
``python -c "import transformers"`` with and without ``kv-guardian run --`` in front.

    .venv/bin/python bench/overhead.py                     # full run, writes bench/results/overhead.json
    .venv/bin/python bench/overhead.py --configs tiny --tokens 32 --pairs 1 --startup-reps 1   # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from results_io import save_json

ROOT = Path(__file__).resolve().parents[1]
CACHES = ("dynamic", "static", "fp8")
PATHS = ("attached", "direct")


def _spec(config: str) -> Any:
    """tiny (2 layers, hidden 64), small (8 layers, hidden 512) or medium (16 layers, hidden 1024)."""
    from kvguardian.apps.repro.models import SMALL, TINY, TinySpec

    medium = TinySpec(hidden=1024, layers=16, heads=16, kv_heads=8, intermediate=2816, vocab=1024)
    return {"tiny": TINY, "small": SMALL, "medium": medium}[config]


@contextlib.contextmanager
def _guarding(model: Any, path: str, stride: int) -> Any:
    """A guard on ``model`` for the block: ``attached`` (``guard.attach(model)``) or ``direct``
    (``guard.attach_process()``, what ``kv-guardian run`` and the pytest plugin do: each top-level generate an
    implicit request)."""
    from kvguardian.runtime.guard import Guard

    guard = Guard(decode_stride=stride)
    if path == "attached":
        guard.attach(model)
    else:
        guard.attach_process(generate=True)
    try:
        yield guard
    finally:
        guard.detach()


def _gen_kwargs(model: Any, cache: str, tokens: int) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
    if cache == "static":
        kw["cache_implementation"] = "static"
    elif cache == "fp8":
        from transformers import QuantizedCache

        from kvguardian.runtime.hf.compat import cache_kwarg, transformers_version

        if transformers_version() < (5, 21):
            raise RuntimeError("the fp8 QuantizedCache backend needs transformers >= 5.21")
        kw[cache_kwarg()] = QuantizedCache(backend="fp8", config=model.config)
    return kw


def _decode(model: Any, ids: Any, cache: str, tokens: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one generate."""
    import warnings

    kw = _gen_kwargs(model, cache, tokens)
    c0, w0 = time.process_time(), time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.generate(ids, **kw)
    return time.process_time() - c0, time.perf_counter() - w0


def _hook_share(model: Any, ids: Any, cache: str, tokens: int, stride: int, path: str) -> dict[str, float]:
    """Time spent inside the tracker per layer update, and as a share of one guarded generate's time: the whole
    of ``HFTracker.on_updates`` (a forward's updates, observed or - with decode-step sampling, see
    `kvguardian.runtime.hf.sampling` - only counted; the ledger's batch and its releases included) over every update the
    forwards made. Both by the monotonic clock (perf_counter: a cheap vDSO read; process_time is a system call
    that costs more than the hook on a loaded machine); the CPU-time figure by this thread's clock."""
    observed = [0.0, 0]
    spent = [0.0, 0, 0]  # wall seconds, updates, CPU ns
    in_batch = [False]
    with _guarding(model, path, stride) as guard:
        tracker = guard.hf_tracker()
        inner = tracker.on_update

        def timed(u: Any) -> None:
            c, t = time.thread_time_ns(), time.perf_counter()
            inner(u)
            dt = time.perf_counter() - t
            observed[0] += dt
            observed[1] += 1
            if not in_batch[0]:  # an update observed at once by the Cache.update wrapper (the direct path)
                spent[0] += dt
                spent[2] += time.thread_time_ns() - c
                spent[1] += 1

        batch = tracker.on_updates

        def timed_batch(updates: Any, started: Any) -> None:  # one forward's updates
            c, t = time.thread_time_ns(), time.perf_counter()
            in_batch[0] = True
            try:
                batch(updates, started)
            finally:
                in_batch[0] = False
            spent[0] += time.perf_counter() - t
            spent[2] += time.thread_time_ns() - c
            spent[1] += len(updates)

        tracker.on_update = timed  # type: ignore[method-assign]  # HFTracker.on_updates calls self.on_update
        tracker.on_updates = timed_batch  # type: ignore[method-assign]  # the forward wrapper calls on_updates
        _, wall = _decode(model, ids, cache, tokens)
    n = max(spent[1], 1)
    return {"hook_us_per_update": round(spent[0] / n * 1e6, 2), "updates": spent[1],
            "hook_share": round(spent[0] / wall, 5) if wall else 0.0,
            # the same work by this thread's CPU time (a preempted hook is not charged for the wait: on a loaded
            # machine the wall figure above counts other processes' time slices)
            "hook_cpu_us_per_update": round(spent[2] / n / 1e3, 2),
            # one observed layer update (HFTracker.on_update alone), and how many of the updates were observed
            "hook_us_per_observed_update": round(observed[0] / max(observed[1], 1) * 1e6, 2),
            "observed_updates": observed[1], "decode_stride": stride}


class _Shims:
    """Timers just outside and just inside kv-guardian's class-level wrappers of ``Cache.update`` and
    ``PreTrainedModel.__call__``: per top-level forward, the sum over those calls of (outer - inner) time is what
    the wrappers, the tracker and the ledger cost that forward - or, unguarded (the outer timer calling the inner
    one directly), what the timers cost themselves."""

    def __init__(self) -> None:
        from torch import nn
        from transformers import PreTrainedModel, cache_utils

        self.cache_cls, self.model_cls = cache_utils.Cache, PreTrainedModel
        self.update0, self.call0 = self.cache_cls.__dict__["update"], nn.Module.__call__
        self.acc = [0, 0, 0]  # ns of (outer - inner) in the current forward, updates in it, model-call depth
        self.forwards: list[tuple[int, int]] = []  # per top-level forward: (ns, updates)

    def _inner(self, fn: Any) -> Any:
        acc, clock = self.acc, time.perf_counter_ns

        def inner(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[0] -= clock() - t

        return inner

    def _outer(self, fn: Any, *, model: bool) -> Any:
        acc, clock, forwards = self.acc, time.perf_counter_ns, self.forwards

        def outer(*args: Any, **kwargs: Any) -> Any:
            if model:
                acc[2] += 1
            else:
                acc[1] += 1
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[0] += clock() - t
                if model:
                    acc[2] -= 1
                    if not acc[2]:
                        forwards.append((acc[0], acc[1]))
                        acc[0] = acc[1] = 0

        return outer

    def run(self, guard: Any, model: Any, fn: Any) -> Any:
        """``fn()`` with the timers on, ``guard(model)`` (attaching or auditing the process) between them (None:
        unguarded)."""
        self.cache_cls.update = self._inner(self.update0)  # type: ignore[method-assign]
        self.model_cls.__call__ = self._inner(self.call0)  # type: ignore[method-assign]
        try:
            if guard is not None:
                guard = guard(model)  # wraps the inner timers
            self.cache_cls.update = self._outer(self.cache_cls.__dict__["update"], model=False)  # type: ignore[method-assign]
            self.model_cls.__call__ = self._outer(self.model_cls.__dict__["__call__"], model=True)  # type: ignore[method-assign]
            return fn()
        finally:
            if guard is not None:
                guard.detach()  # puts the inner timers back
            self.cache_cls.update = self.update0  # type: ignore[method-assign]
            if "__call__" in self.model_cls.__dict__:
                del self.model_cls.__call__


def _hook_all_in(model: Any, ids: Any, cache: str, tokens: int, stride: int, path: str) -> dict[str, Any]:
    """What kv-guardian costs per layer update inside ``generate``, nothing left out but the storages' release
    callbacks (a deque append each, inside the model's own kernels): the time just inside minus just outside
    its wrappers, summed per decode forward; guarded minus unguarded (the timers' own cost) in interleaved
    generates (unguarded, guarded, guarded, unguarded), the median forward of each, divided by the updates per
    forward. Wall time (perf_counter) per forward: a median over hundreds of forwards is not moved by the other
    processes' time slices that a mean would count."""
    from kvguardian.runtime.guard import Guard

    def guard(m: Any) -> Guard:
        g = Guard(decode_stride=stride)
        return g.attach(m) if path == "attached" else g.attach_process(generate=True)

    per: dict[str, list[tuple[int, int]]] = {"guarded": [], "unguarded": []}
    for guarded in (False, True, True, False):
        shims = _Shims()
        shims.run(guard if guarded else None, model, lambda: _decode(model, ids, cache, tokens))
        per["guarded" if guarded else "unguarded"].extend(shims.forwards[1:])  # the prefill left out
    ups = statistics.median(n for _, n in per["guarded"]) or 1
    g = statistics.median(ns for ns, _ in per["guarded"])
    u = statistics.median(ns for ns, _ in per["unguarded"])
    g_mean = statistics.fmean(ns for ns, _ in per["guarded"])
    u_mean = statistics.fmean(ns for ns, _ in per["unguarded"])
    return {"hook_all_in_us_per_update": round((g - u) / ups / 1e3, 2),
            "hook_all_in_us_per_update_mean": round((g_mean - u_mean) / ups / 1e3, 2),
            "hook_all_in_timer_us_per_update": round(u / ups / 1e3, 2), "updates_per_forward": ups,
            "hook_all_in_forwards": len(per["guarded"])}


def bench_decode(config: str, cache: str, tokens: int, pairs: int, stride: int, path: str) -> dict[str, Any]:
    import torch

    from kvguardian.apps.repro.models import build_llama

    spec = _spec(config)
    model = build_llama(spec)
    ids = torch.randint(0, spec.vocab, (1, 8), generator=torch.Generator().manual_seed(0))
    _decode(model, ids, cache, min(tokens, 16))  # warm-up
    rows = {"unguarded": [], "guarded": []}  # type: dict[str, list[tuple[float, float]]]

    def one(guarded: bool) -> None:
        if guarded:
            with _guarding(model, path, stride):
                rows["guarded"].append(_decode(model, ids, cache, tokens))
        else:
            rows["unguarded"].append(_decode(model, ids, cache, tokens))

    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        for g in order:
            one(g)
    cpu_ratios = [tokens / g[0] / (tokens / u[0]) for u, g in zip(rows["unguarded"], rows["guarded"])]
    wall_ratios = [tokens / g[1] / (tokens / u[1]) for u, g in zip(rows["unguarded"], rows["guarded"])]
    share = _hook_share(model, ids, cache, tokens, stride, path)
    share.update(_hook_all_in(model, ids, cache, tokens, stride, path))

    def tps(vals: list[tuple[float, float]], i: int) -> float:
        return round(statistics.median(tokens / v[i] for v in vals), 2)

    return {
        "config": config, "path": path, "model": spec.describe(), "cache": cache, "new_tokens": tokens,
        "pairs": pairs,
        "unguarded_tokens_per_s_cpu": tps(rows["unguarded"], 0),
        "guarded_tokens_per_s_cpu": tps(rows["guarded"], 0),
        "unguarded_tokens_per_s_wall": tps(rows["unguarded"], 1),
        "guarded_tokens_per_s_wall": tps(rows["guarded"], 1),
        "ratio": round(statistics.median(cpu_ratios), 4),
        "ratio_wall": round(statistics.median(wall_ratios), 4),
        "ratios_per_pair": [round(r, 4) for r in cpu_ratios],
        **share,
    }


def _make_cache(model: Any, cache: str, max_len: int) -> Any:
    from transformers import DynamicCache, QuantizedCache, StaticCache

    if cache == "static":
        return StaticCache(config=model.config, max_cache_len=max_len)
    if cache == "fp8":
        return QuantizedCache(backend="fp8", config=model.config)
    return DynamicCache(config=model.config)


def bench_steps(config: str, cache: str, tokens: int, rounds: int, stride: int, path: str) -> dict[str, Any]:
    """Interleaved steps: one manual decode loop where the guard's hooks run on even steps and are switched
    off on odd ones (attached: ``Attachment.enabled``, the forward hooks return at once, so the ``Cache.update``
    wrapper sees no active guard and costs one context-variable read; direct: the process audit stopped and
    started again between steps, outside the timed forward), so each guarded step has an unguarded
    neighbour of the same sequence length, measured under the same machine conditions. On a shared VM whose
    speed drifts by tens of percent between runs, this resolves a 1-2% effect that whole-generate comparisons
    cannot. Ratio = median over neighbour pairs
    of (unguarded step time / guarded step time), i.e. guarded/unguarded throughput. Each round is one request
    (``guard.request``), as a ``generate()`` call is, so the guarded steps are sampled as there (one in
    ``stride`` of them observed, `kvguardian.runtime.hf.sampling`)."""
    import torch

    from kvguardian.apps.repro.models import build_llama
    from kvguardian.runtime.guard import Guard
    from kvguardian.runtime.hf.compat import cache_kwarg

    spec = _spec(config)
    model = build_llama(spec)
    kw = cache_kwarg()
    ids = torch.randint(0, spec.vocab, (1, 8), generator=torch.Generator().manual_seed(0))
    guard = Guard(decode_stride=stride)
    if path == "attached":
        guard.attach(model)
        attachment = guard.attachments[-1]

        def switch(on: bool) -> None:
            attachment.enabled = on
    else:
        guard.attach_process(generate=False)

        def switch(on: bool) -> None:
            if on:
                guard.attach_process(generate=False)
            else:
                guard.detach_process()
    ratios: list[float] = []
    hooked: list[float] = []
    plain: list[float] = []
    try:
        for _ in range(rounds):
            c = _make_cache(model, cache, ids.shape[1] + tokens + 1)
            x = ids
            switch(True)
            with guard.request(f"steps-{len(ratios)}"), torch.inference_mode():
                out = model(x, use_cache=True, **{kw: c})  # prefill, not timed
                x = out.logits[:, -1:].argmax(-1)
                prev: float | None = None
                for step in range(tokens):
                    on = step % 2 == 0
                    switch(on)
                    t0 = time.perf_counter()
                    out = model(x, use_cache=True, **{kw: c})
                    dt = time.perf_counter() - t0
                    x = out.logits[:, -1:].argmax(-1)
                    (hooked if on else plain).append(dt)
                    if not on and prev is not None:
                        ratios.append(dt / prev)
                    prev = dt
                switch(True)
            del c, out
    finally:
        switch(True)
        guard.detach()
    return {
        "config": config, "path": path, "cache": cache, "steps": tokens, "rounds": rounds,
        "guarded_step_us_median": round(statistics.median(hooked) * 1e6, 1),
        "unguarded_step_us_median": round(statistics.median(plain) * 1e6, 1),
        "ratio": round(statistics.median(ratios), 4),
        "pairs": len(ratios),
    }


def bench_startup(reps: int) -> dict[str, Any]:
    """Wall seconds of the child program alone vs under `kv-guardian run`, median of ``reps``."""
    py = sys.executable
    cli = [py, "-m", "kvguardian", "run", "--quiet", "--"]
    out: dict[str, Any] = {"reps": reps}
    for name, code in (("empty", "pass"), ("import_transformers", "import transformers, transformers.cache_utils")):
        plain, wrapped = [], []
        for _ in range(reps):
            for cmd, bucket in (([py, "-c", code], plain), ([*cli, py, "-c", code], wrapped)):
                t = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
                bucket.append(time.perf_counter() - t)
        p, w = statistics.median(plain), statistics.median(wrapped)
        out[name] = {"plain_s": round(p, 3), "under_run_s": round(w, 3), "overhead_s": round(w - p, 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="tiny,small",
                    help="comma-separated: tiny, small, medium (default: tiny,small)")
    ap.add_argument("--paths", default="attached",
                    help="comma-separated: attached (guard.attach), direct (guard.attach_process, what "
                         "kv-guardian run does) (default: attached)")
    ap.add_argument("--caches", default=",".join(CACHES), help="comma-separated: dynamic, static, fp8")
    ap.add_argument("--tokens", type=int, default=512, help="new tokens per generate (default: 512)")
    ap.add_argument("--pairs", type=int, default=4, help="guarded/unguarded pairs per case (default: 4)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1, steadier on a shared box)")
    ap.add_argument("--startup-reps", type=int, default=5, help="repetitions of the start-up timing (0: skip)")
    ap.add_argument("--step-rounds", type=int, default=3,
                    help="rounds of the interleaved-steps estimator per case (0: skip)")
    ap.add_argument("--decode-stride", type=int, default=8,
                    help="Guard(decode_stride=...): observe one decode forward in N (default 8, the Guard's; 1: all)")
    ap.add_argument("--skip-generate", action="store_true", help="only the interleaved-steps estimator")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "overhead.json"))
    args = ap.parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {
        "benchmark": "overhead",
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "cpus": os.cpu_count(), "torch_threads": args.threads,
                    "load_avg_at_start": os.getloadavg()},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "target": "guarded/unguarded decode tokens/s >= 0.98 on the small config; hook <= 5 us per layer update",
        "decode_stride": args.decode_stride,
        "decode": [],
        "interleaved_steps": [],
    }
    for config, cache, path in itertools.product(args.configs.split(","), args.caches.split(","),
                                                 args.paths.split(",")):
        config, cache, path = config.strip(), cache.strip(), path.strip()
        if args.step_rounds > 0:
            srow = bench_steps(config, cache, args.tokens, args.step_rounds, args.decode_stride, path)
            results["interleaved_steps"].append(srow)
            print(f"{srow['config']:5s} {srow['cache']:7s} {path:8s} interleaved steps: guarded "
                  f"{srow['guarded_step_us_median']:.0f} us, unguarded {srow['unguarded_step_us_median']:.0f} us, "
                  f"ratio {srow['ratio']:.4f} ({srow['pairs']} neighbour pairs)", flush=True)
        if args.skip_generate:
            continue
        row = bench_decode(config, cache, args.tokens, args.pairs, args.decode_stride, path)
        results["decode"].append(row)
        print(f"{row['config']:5s} {row['cache']:7s} {path:8s} "
              f"unguarded {row['unguarded_tokens_per_s_cpu']:8.1f} tok/s  "
              f"guarded {row['guarded_tokens_per_s_cpu']:8.1f} tok/s  ratio {row['ratio']:.4f} "
              f"(wall {row['ratio_wall']:.4f})  hooks {row['hook_share'] * 100:.2f}% of decode time "
              f"({row['hook_us_per_update']} us/update wall, {row['hook_cpu_us_per_update']} us CPU); all-in "
              f"{row['hook_all_in_us_per_update']} us/update (mean {row['hook_all_in_us_per_update_mean']}; "
              f"target 5)",
              flush=True)
    if args.startup_reps > 0:
        results["run_startup"] = bench_startup(args.startup_reps)
        print("run start-up:", json.dumps(results["run_startup"]), flush=True)
    results["load_avg_at_end"] = os.getloadavg()
    small = [r["ratio"] for r in results["decode"] if r["config"] == "small"]
    results["small_min_ratio"] = min(small) if small else None
    small_steps = [r["ratio"] for r in results["interleaved_steps"] if r["config"] == "small"]
    results["small_min_ratio_interleaved"] = min(small_steps) if small_steps else None
    out = save_json(args.out, results)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
