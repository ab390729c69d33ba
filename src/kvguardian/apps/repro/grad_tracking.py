"""§2.1 — a KV cache built under autograd keeps every decode step's graph alive.

A tiny random-weight Llama decodes with a manual ``model(..., use_cache=True)`` loop under
``torch.enable_grad()``; then the same loop with each fix: ``torch.no_grad()``, ``torch.inference_mode()``,
and detaching the cache after every step. At each step count we measure the KV bytes, the bytes of saved
tensors reachable from the cache's autograd graph (storages counted once, the cache itself excluded) and the
graph's node count, and fit the growth exponent on log-log axes. The guard's KVG101 must fire at the first
step of the grad loop and stay silent for every fix, and for ``generate()``, which runs under ``no_grad``.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import TYPE_CHECKING, Any

from kvguardian.apps.repro import DemoRow, ReproResult, verdict_line
from kvguardian.apps.repro.fit import growth_exponent, local_exponent, quadratic_share
from kvguardian.apps.repro.models import GRAD_SPEC, TinySpec, build_llama
from kvguardian.core.errors import UsageError
from kvguardian.core.report.reporter import Reporter

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM, PretrainedConfig

NAME = "grad-tracking"
SECTION = "§2.1"
TITLE = "KV cache built under autograd retains every step's graph"

MODES = ("enable_grad", "no_grad", "inference_mode", "detach")
DEFAULT_STEPS = (64, 128, 256, 512)
DEMO_STEPS = (64, 128, 256)
PROMPT_LEN = 16

#: The article's table (§2.1): context length -> (peak GPU memory GiB, "cache objects").
ARTICLE_TABLE = ((1024, 2.1, 16_384), (8192, 18.7, 131_072))
#: Earlier research on a 2-core machine (docs/design/repro.md): saved MiB at 128/256/512 steps, hidden 256, 4 layers.
RESEARCH_MIB = ((128, 41.0), (256, 122.7), (512, 429.9))

MIB = 2**20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--steps", default=",".join(map(str, DEFAULT_STEPS)),
        help="comma-separated decode step counts to measure at (default: %(default)s)",
    )


def parse_steps(text: str) -> list[int]:
    try:
        steps = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise UsageError(f"--steps {text!r} is not a list of integers; fix: e.g. --steps 64,128,256") from None
    if len(steps) < 2 or steps[0] < 1 or steps[-1] > 8192:
        raise UsageError(
            f"--steps {text!r} needs at least two step counts between 1 and 8192 to fit an exponent; "
            "fix: e.g. --steps 64,128,256"
        )
    return steps


def _context(mode: str) -> Any:
    import torch

    return {
        "enable_grad": torch.enable_grad,
        "detach": torch.enable_grad,
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
    }[mode]()


def detaching_cache(config: PretrainedConfig) -> Any:
    """The detach fix: a DynamicCache that stores detached K/V, so no step's graph is kept by the cache."""
    from transformers import DynamicCache

    class DetachingCache(DynamicCache):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> Any:
            return super().update(key_states.detach(), value_states.detach(), layer_idx, *args, **kwargs)

    return DetachingCache(config=config)


def measure_mode(model: LlamaForCausalLM, mode: str, steps: list[int]) -> dict[str, Any]:
    """Decode ``max(steps)`` tokens in ``mode`` under a guard; measure at each step count."""
    import torch
    from transformers import DynamicCache

    from kvguardian.core.detectors import DetectContext
    from kvguardian.core.detectors.grad_tracked import detect as detect_grad
    from kvguardian.core.tensors.autograd import walk_graph
    from kvguardian.runtime.guard import Guard
    from kvguardian.runtime.hf.compat import cache_kwarg

    kw = cache_kwarg()
    guard = Guard()
    guard.attach(model)
    points = []
    flagged_at: int | None = None
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, model.config.vocab_size, (1, PROMPT_LEN), generator=gen)
    try:
        with guard.request(f"decode-{mode}"), _context(mode):
            cache = detaching_cache(model.config) if mode == "detach" else DynamicCache(config=model.config)
            for step in range(1, steps[-1] + 1):
                out = model(x, use_cache=True, **{kw: cache})
                x = out.logits[:, -1:].argmax(-1)
                del out
                if flagged_at is None and detect_grad(guard.snapshot(), DetectContext()):
                    flagged_at = step
                if step in steps or step == 1:
                    tensors: list[Any] = [t for layer in cache.layers for t in (layer.keys, layer.values)]  # type: ignore[union-attr]
                    kv_keys = {t.untyped_storage().data_ptr() for t in tensors}
                    kv_bytes = sum(t.untyped_storage().nbytes() for t in tensors)
                    stats = walk_graph(tensors, max_nodes=10_000_000, max_seconds=120, exclude_keys=kv_keys)
                    points.append({
                        "steps": step,
                        "kv_bytes": kv_bytes,
                        "graph_saved_bytes": stats.saved_bytes,
                        "graph_nodes": stats.nodes,
                        "held_bytes": kv_bytes + stats.saved_bytes,
                    })
            del cache, tensors
        report = guard.check(holder_chains=False)
    finally:
        guard.detach()
    prefill = points.pop(0) if points and points[0]["steps"] == 1 and 1 not in steps else points[0]
    xs = [p["steps"] for p in points]
    # bytes accumulated by decoding: held at step n minus held right after the prefill (step 1)
    grown = [p["held_bytes"] - prefill["held_bytes"] for p in points]
    return {
        "mode": mode,
        "points": points,
        "prefill": prefill,
        "exponent": growth_exponent(xs, grown),
        "local_exponent": local_exponent(xs, grown),
        "raw_exponent": growth_exponent(xs, [p["held_bytes"] for p in points]),
        "quadratic_share": quadratic_share(xs, grown) if mode == "enable_grad" else None,
        "kvg101_first_step": flagged_at,
        "kvg101": "KVG101" in report.ids(),
        "seconds": time.perf_counter() - t0,
    }


def measure_generate(model: LlamaForCausalLM) -> dict[str, Any]:
    """``generate()`` inside ``enable_grad()``: it is decorated ``no_grad``, so no graph, no KVG101."""
    import torch

    from kvguardian.runtime.guard import Guard

    guard = Guard()
    guard.attach(model)
    try:
        with torch.enable_grad():
            ids = torch.randint(0, model.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(2))
            model.generate(ids, max_new_tokens=16, do_sample=False)
        report = guard.check(holder_chains=False)
    finally:
        guard.detach()
    return {"kvg101": "KVG101" in report.ids(), "findings": sorted(report.ids())}


def measure(steps: list[int], spec: TinySpec = GRAD_SPEC) -> dict[str, Any]:
    model = build_llama(spec)
    modes = {mode: measure_mode(model, mode, steps) for mode in MODES}
    gen = measure_generate(model)
    grad = modes["enable_grad"]
    fixes = [modes[m] for m in MODES if m != "enable_grad"]
    fix_ok = all(
        f["kvg101_first_step"] is None and not f["kvg101"] and f["exponent"] <= 1.2
        and all(p["graph_saved_bytes"] == 0 for p in f["points"])
        for f in fixes
    )
    grad_ok = grad["kvg101_first_step"] == 1 and grad["exponent"] >= max(f["exponent"] for f in fixes) + 0.2
    return {
        "model": spec.describe(),
        "prompt_tokens": PROMPT_LEN,
        "steps": steps,
        "modes": modes,
        "generate": gen,
        "grad_detected_first_step": grad["kvg101_first_step"] == 1,
        "fixes_verified": fix_ok,
        "generate_immune": not gen["kvg101"],
        "article": [{"context": c, "gib": g, "objects": o} for c, g, o in ARTICLE_TABLE],
        "research_mib": [{"steps": s, "mib": m} for s, m in RESEARCH_MIB],
        "ok": grad_ok and fix_ok and not gen["kvg101"],
    }


def _fmt_exp(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def render(data: dict[str, Any], out: Reporter) -> None:
    out.text(f"model: {data['model']}, prompt {data['prompt_tokens']} tokens, CPU")
    out.table("memory held after n decode steps, per mode",
              ["mode", "steps", "KV MiB", "graph MiB", "nodes", "held MiB"],
              [[mode, p["steps"], f"{p['kv_bytes'] / MIB:.2f}", f"{p['graph_saved_bytes'] / MIB:.1f}",
                p["graph_nodes"], f"{p['held_bytes'] / MIB:.1f}"]
               for mode in MODES for p in data["modes"][mode]["points"]])
    out.text("growth exponent: least-squares slope on log-log axes of the bytes accumulated by decoding (held at "
             "step n minus held after the prefill); 'raw' fits the held bytes themselves, prefill included.")
    for mode in MODES:
        m = data["modes"][mode]
        extra = ""
        if m["quadratic_share"] is not None:
            extra = f", quadratic share at {m['points'][-1]['steps']} steps {m['quadratic_share']:.0%}"
        flag = f"KVG101 at step {m['kvg101_first_step']}" if m["kvg101_first_step"] else "KVG101 silent"
        out.text(
            f"{mode:<15} growth exponent {_fmt_exp(m['exponent'])} (last pair {_fmt_exp(m['local_exponent'])}"
            f"{extra}; raw {_fmt_exp(m['raw_exponent'])}); {flag}"
        )
    g = data["generate"]
    out.text(
        f"{'generate()':<15} inside enable_grad(): KVG101 {'FIRED' if g['kvg101'] else 'silent'} — generate() is "
        "decorated @torch.no_grad(), so it never builds a graph; the anti-pattern needs a manual decode loop"
    )
    out.text("")
    out.text("The article's table (a GPU model it does not name) beside ours:")
    for row in data["article"]:
        out.text(f"  article: context {row['context']:>5} → {row['gib']} GiB, {row['objects']:,} objects")
    for p in data["modes"]["enable_grad"]["points"]:
        out.text(f"  here:    {p['steps']:>5} steps → {p['held_bytes'] / MIB:.1f} MiB held, "
                 f"{p['graph_nodes']:,} graph nodes")
    research = ", ".join(f"{r['mib']} MiB at {r['steps']}" for r in data["research_mib"])
    out.text(f"  earlier research on this machine, same config: {research}")
    out.text("What differs: the article's own numbers grow linearly (8× context → 8.9× memory, 8× objects), not as "
             "O(n²); its 'objects' are not defined. Here, the graph of each step saves activations that do not "
             "depend on n (linear total) plus attention inputs that grow with n (quadratic total), so the exponent "
             "climbs toward 2 as n grows. Memory is counted as storage bytes reachable from the cache's graph, "
             "not RSS or GPU allocator peaks.")
    verdict_line(out, f"grad case flagged at step 1: {data['grad_detected_first_step']}; fixes verified: "
                 f"{data['fixes_verified']}; generate() immune: {data['generate_immune']}")


def run(args: argparse.Namespace) -> ReproResult:
    steps = parse_steps(args.steps)
    data = measure(steps)
    return ReproResult(NAME, SECTION, TITLE, data, render, ok=data["ok"])


def demo_row() -> DemoRow:
    data = measure(list(DEMO_STEPS))
    grad = data["modes"]["enable_grad"]
    first, last = grad["points"][0], grad["points"][-1]
    fix_exps = [data["modes"][m]["exponent"] for m in MODES if m != "enable_grad"]
    fix_max_mib = max(p["held_bytes"] for m in MODES if m != "enable_grad" for p in data["modes"][m]["points"]) / MIB
    measured = (
        f"grad: {first['held_bytes'] / MIB:.0f}→{last['held_bytes'] / MIB:.0f} MiB held at "
        f"{first['steps']}→{last['steps']} steps (exponent {grad['exponent']:.2f}, last pair "
        f"{grad['local_exponent']:.2f}); fixes: ≤{fix_max_mib:.1f} MiB (exponent ≤{max(fix_exps):.2f})"
    )
    fixes_silent = "silent on no_grad, inference_mode, detach" if data["fixes_verified"] else "NOT silent on a fix"
    verdict = (
        f"KVG101 at step {grad['kvg101_first_step']}; {fixes_silent}; "
        f"generate() {'immune' if data['generate_immune'] else 'FLAGGED'}"
    )
    return DemoRow(
        name=NAME,
        section=SECTION,
        article_claim="1,024 ctx → 2.1 GiB, 8,192 → 18.7 GiB; O(n²) graph retention",
        measured=measured,
        verdict=verdict,
        fix_verified=data["fixes_verified"],
        ok=data["ok"],
        details={"exponent": grad["exponent"], "fix_exponents": fix_exps},
    )
