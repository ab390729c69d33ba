"""What following KV copies at the torch op would cost a decode step: the cheapest interceptions of
``clone``/``to``/``contiguous``/``torch.cat`` (the ways KV is copied into a new storage), each doing nothing
but passing the call on, timed against the plain model in interleaved decode steps.

A copy is a new storage with nothing linking it to the KV it came from except the call that made it, so the
ledger could follow one only by intercepting those calls. Two routes, both switched on and off on alternate
steps of one decode loop (each guarded step has a plain neighbour of the same length; median of neighbour
ratios):

- ``mode``: an empty ``torch.overrides.TorchFunctionMode`` (every torch call of the forward passes through it);
- ``patch``: ``torch.Tensor.clone``/``to``/``contiguous`` and ``torch.cat`` replaced by Python wrappers that
  test one flag and call the original (the model's own calls of them pass through the wrappers).

Beside them, what one pass-through wrapper adds to a call in a warm loop (``timeit``, the least it can cost),
and whether ``torch.jit.script`` still compiles a function calling ``torch.cat`` once it is wrapped (a change
of the program's behaviour, not only of its speed).

    nice .venv/bin/python bench/copy_follow.py [--configs small,medium] [--steps 128] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from results_io import save_json

ROOT = Path(__file__).resolve().parents[1]
_PATCHED = (("Tensor", "clone"), ("Tensor", "to"), ("Tensor", "contiguous"), ("torch", "cat"))


def _spec(config: str) -> Any:
    from kvguardian.apps.repro.models import SMALL, TinySpec

    medium = TinySpec(hidden=1024, layers=16, heads=16, kv_heads=8, intermediate=2816, vocab=1024)
    return {"small": SMALL, "medium": medium}[config]


def _mode(calls: list[int]) -> Any:
    from torch.overrides import TorchFunctionMode

    class Passing(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            calls[0] += 1
            return func(*args, **(kwargs or {}))

    return Passing()


@contextlib.contextmanager
def _patched(calls: list[int]) -> Any:
    """The four copying calls wrapped by a pass-through that tests one flag (what a follower would test first)."""
    import torch

    flag = [None]
    saved = []
    for owner_name, name in _PATCHED:
        owner = torch.Tensor if owner_name == "Tensor" else torch
        original = getattr(owner, name)

        def wrapper(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls[0] += 1
            if flag[0] is not None:
                pass
            return _original(*args, **kwargs)

        saved.append((owner, name, original))
        setattr(owner, name, wrapper)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def bench(config: str, route: str, steps: int, rounds: int) -> dict[str, Any]:
    import torch
    from transformers import DynamicCache

    from kvguardian.apps.repro.models import build_llama
    from kvguardian.runtime.hf.compat import cache_kwarg

    spec = _spec(config)
    model = build_llama(spec)
    kw = cache_kwarg()
    ids = torch.randint(0, spec.vocab, (1, 8), generator=torch.Generator().manual_seed(0))
    calls = [0]
    ratios: list[float] = []
    on_t: list[float] = []
    off_t: list[float] = []
    for _ in range(rounds):
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            x = model(ids, use_cache=True, **{kw: cache}).logits[:, -1:].argmax(-1)
            prev = None
            for step in range(steps):
                on = step % 2 == 0
                ctx = (_mode(calls) if route == "mode" else _patched(calls)) if on else contextlib.nullcontext()
                with ctx:
                    t0 = time.perf_counter()
                    out = model(x, use_cache=True, **{kw: cache})
                    dt = time.perf_counter() - t0
                x = out.logits[:, -1:].argmax(-1)
                (on_t if on else off_t).append(dt)
                if not on and prev is not None:
                    ratios.append(dt / prev)
                prev = dt
    on_med, off_med = statistics.median(on_t), statistics.median(off_t)
    return {"config": config, "route": route, "layers": spec.layers, "steps": steps, "rounds": rounds,
            "step_us_with": round(on_med * 1e6, 1), "step_us_without": round(off_med * 1e6, 1),
            "ratio": round(statistics.median(ratios), 4),
            "us_per_layer_update": round((on_med - off_med) / spec.layers * 1e6, 2),
            "intercepted_calls_per_layer_update": round(calls[0] / len(on_t) / spec.layers, 1)}


def wrapper_cost() -> dict[str, Any]:
    """ns a pass-through wrapper adds to ``Tensor.contiguous`` in a warm loop; whether TorchScript still compiles
    ``torch.cat`` once ``torch.cat`` is wrapped."""
    import timeit

    import torch

    t = torch.ones(1, 2, 8, 16)
    n = 100_000
    base = min(timeit.repeat(t.contiguous, number=n, repeat=5)) / n
    with _patched([0]):
        wrapped = min(timeit.repeat(t.contiguous, number=n, repeat=5)) / n
        try:
            def cat_twice(x: torch.Tensor) -> torch.Tensor:
                return torch.cat([x, x])

            torch.jit.script(cat_twice)
            scripted = "compiles"
        except Exception as exc:
            scripted = f"fails: {type(exc).__name__}"
    return {"contiguous_ns": round(base * 1e9), "wrapped_contiguous_ns": round(wrapped * 1e9),
            "wrapper_ns_per_call_warm": round((wrapped - base) * 1e9), "torchscript_of_wrapped_cat": scripted}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="small,medium", help="comma-separated: small, medium")
    ap.add_argument("--steps", type=int, default=128, help="decode steps per round (default: 128)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per case (default: 2)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "copy_follow.json"))
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows = []
    for config in args.configs.split(","):
        for route in ("mode", "patch"):
            row = bench(config.strip(), route, args.steps, args.rounds)
            rows.append(row)
            print(f"{row['config']:6s} {route:5s} step {row['step_us_with']:.0f} us with, {row['step_us_without']:.0f} "
                  f"us without; ratio {row['ratio']:.4f}; {row['us_per_layer_update']} us per layer update "
                  f"({row['intercepted_calls_per_layer_update']} intercepted calls each)", flush=True)
    cost = wrapper_cost()
    print(f"a pass-through wrapper adds {cost['wrapper_ns_per_call_warm']} ns per call (warm); torch.jit.script of "
          f"a function calling the wrapped torch.cat: {cost['torchscript_of_wrapped_cat']}", flush=True)
    out = save_json(args.out, {"benchmark": "copy_follow", "command": " ".join(["python", *sys.argv]),
                               "load_avg": os.getloadavg(), "rows": rows, "wrapper": cost})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
