"""The cost of the Cache.update hook in a figure that load does not move: Python bytecodes and Python calls run
inside kvguardian per layer update, counted with ``sys.settrace`` over steady-state decode steps.

On a shared machine, timings of a few microseconds per layer drift by tens of percent between runs; the count of
executed bytecodes does not, so two versions of the hook can be compared exactly (run it once per checkout).
Three paths are counted: ``attached`` (``guard.attach(model)``: updates queued during the forward and observed
when it returns), ``direct`` (``guard.attach_process()``, what ``kv-guardian run`` and the pytest plugin do: a
model forward's updates queued and observed when it returns, as attached) and ``outside`` (``attach_process()``,
a cache updated outside any model forward: each update observed at once). All inside one request, so decode
steps are sampled (``Guard(decode_stride=8)``, the default). No model compute: the small config's cache layers
are updated directly, one token per step, as a decode step does.

    .venv/bin/python bench/hook_ops.py [--steps 20] [--out bench/results/hook_ops.json]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from results_io import save_json

ROOT = Path(__file__).resolve().parents[1]


def count(cache_kind: str, path: str, steps: int) -> dict[str, Any]:
    import torch
    from transformers import DynamicCache, QuantizedCache, StaticCache

    import kvguardian
    from kvguardian.apps.repro.models import SMALL, build_llama
    from kvguardian.runtime.guard import Guard
    from kvguardian.runtime.hf import instrument

    cfg = build_llama(SMALL).config
    layers = cfg.num_hidden_layers
    heads, dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    pkg = os.path.dirname(kvguardian.__file__)
    guard = Guard()
    if path == "attached":
        instrument.install_cache_patch()
    else:
        guard.attach_process(generate=False)
    tracker = guard.hf_tracker()
    make = {"static": lambda: StaticCache(config=cfg, max_cache_len=steps + 16),
            "fp8": lambda: QuantizedCache(backend="fp8", config=cfg)}.get(cache_kind, lambda: DynamicCache(config=cfg))
    cache = make()
    counts = {"bytecodes": 0, "calls": 0}

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.startswith(pkg):
            return None
        if event == "call":
            counts["calls"] += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            counts["bytecodes"] += 1
        return tracer

    def layers_step(_: Any, x: Any, pos: int, n: int) -> None:  # a decode forward's cache updates
        kwargs = {"cache_position": torch.arange(pos, pos + n)}
        for i in range(layers):
            if cache_kind == "static":
                cache.update(x, x, i, kwargs)
            else:
                cache.update(x, x, i)

    def step(x: Any, pos: int, n: int) -> None:
        if path == "attached":
            active, pending = instrument.ACTIVE.set(tracker), instrument.PENDING.set([])
            layers_step(None, x, pos, n)
            updates = instrument.PENDING.get()
            instrument.ACTIVE.reset(active)
            instrument.PENDING.reset(pending)
            tracker.on_updates(updates or [], None)
        elif path == "direct":  # what the forward wrapper of the process audit does around a model's forward
            instrument.observe_forward(tracker, layers_step, None, (x, pos, n), {})
        else:
            layers_step(None, x, pos, n)

    try:
        with torch.inference_mode(), guard.request("r"):
            step(torch.zeros(1, heads, 8, dim), 0, 8)  # prefill
            for s in range(3):  # warm-up: every entry exists and continues
                step(torch.zeros(1, heads, 1, dim), 8 + s, 1)
            sys.settrace(tracer)
            try:
                for s in range(steps):
                    step(torch.zeros(1, heads, 1, dim), 11 + s, 1)
            finally:
                sys.settrace(None)
    finally:
        if path == "attached":
            instrument.uninstall_cache_patch()
        else:
            guard.detach_process()
    n = steps * layers
    return {"cache": cache_kind, "path": path, "updates": n, "bytecodes_per_update": round(counts["bytecodes"] / n, 1),
            "python_calls_per_update": round(counts["calls"] / n, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="counted decode steps per case (default: 20)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "hook_ops.json"))
    args = ap.parse_args(argv)
    rows = []
    for cache_kind in ("dynamic", "static", "fp8"):
        for path in ("attached", "direct", "outside"):
            row = count(cache_kind, path, args.steps)
            rows.append(row)
            print(f"{cache_kind:8s} {path:8s} {row['bytecodes_per_update']:7.1f} bytecodes "
                  f"{row['python_calls_per_update']:5.2f} calls per layer update", flush=True)
    out = save_json(args.out, {"benchmark": "hook_ops", "config": "small", "steps": args.steps, "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
