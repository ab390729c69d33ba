"""§2.3 — does attention leak memory at sequence lengths that are not a power of two?

The article claims FlashAttention-2 leaks ≈151 MB per call at length 1023 through a floor division. Here
`kv-guardian sweep` runs PyTorch's SDPA around every power of two and checks storages (ledger), the C allocator
and the last rows; a control that frees ``length // 64`` workspaces must be caught, its ``ceil`` fix must pass.
Why FlashAttention-2's source does not have the bug: docs/design/repro.md.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from kvguardian.apps.repro import DemoRow, ReproResult, verdict_line
from kvguardian.core.errors import UsageError
from kvguardian.core.report.reporter import Reporter

if TYPE_CHECKING:
    import torch

NAME = "nonpow2"
SECTION = "§2.3"
TITLE = "non-power-of-two sequence lengths: does attention leak at 2^k-1?"

BLOCK_M = 64
DEMO_MAX_LENGTH = 1024  # the demo stops at 1025 (the claim is about 1023/1024); the repro goes to 2049
ARTICLE = {"length": 1023, "leak_mb": 151.2, "blocks_needed": 16, "blocks_freed": 15, "clean_length": 1024}

#: The control's "workspace": K/V slices handed to each row block, waiting to be released. Module-level, as
#: the workspace pools of real kernels' Python wrappers are.
_STAGED: list[tuple[Any, Any]] = []


def _blockwise(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, ceil_release: bool) -> torch.Tensor:
    """Stage one K/V workspace per 64-row block, compute, release ``released`` of them.

    The workspaces are what the article says a kernel keeps per row block (here: views of K and V up to the
    block's last row, which keep the whole K/V storages alive while referenced). The attention itself is
    computed by SDPA on the whole sequence (same result as a block-by-block loop, far fewer Python steps), so
    the control's only difference from a clean kernel is the release count.
    """
    import torch.nn.functional as F

    s = q.shape[2]  # q, k, v: [B, H, S, D]
    nblocks = -(-s // BLOCK_M)  # the kernel covers every row: ceil
    for i in range(nblocks):
        end = min(s, (i + 1) * BLOCK_M) if is_causal else s
        _STAGED.append((k[:, :, :end], v[:, :, :end]))  # the block's workspace
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    released = nblocks if ceil_release else s // BLOCK_M  # the bug: floor drops the partial block's release
    first = len(_STAGED) - nblocks
    del _STAGED[first:first + released]
    return out


def leaky_blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              is_causal: bool = False) -> torch.Tensor:
    """Block-tiled attention that frees ``length // 64`` block workspaces: leaks when length % 64 != 0."""
    return _blockwise(q, k, v, is_causal, ceil_release=False)


def fixed_blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              is_causal: bool = False) -> torch.Tensor:
    """The same, freeing ``ceil(length / 64)`` workspaces: returns all memory at every length."""
    return _blockwise(q, k, v, is_causal, ceil_release=True)


def measure(*, max_length: int, heads: int, repeats: int) -> dict[str, Any]:
    import torch

    from kvguardian.apps.repro.threads import torch_threads
    from kvguardian.runtime.sweep import SweepConfig, Target, parse_lengths, resolve_targets, run_sweep

    lengths = parse_lengths("pow2", max_length=max_length)
    cfg = SweepConfig(heads=heads, repeats=repeats)
    t0 = time.perf_counter()
    with torch_threads(1):  # stable timings on a shared machine; memory behaviour does not depend on it
        sdpa, notes = resolve_targets(["sdpa"], device=torch.device("cpu"), dtype=torch.float32)
        real = run_sweep(sdpa, lengths, cfg, notes=notes)
        try:
            controls = run_sweep(
                [Target("control-floor", leaky_blockwise_attention, "bhsd", "is_causal"),
                 Target("control-ceil", fixed_blockwise_attention, "bhsd", "is_causal")],
                lengths, cfg,
            )
        finally:
            _STAGED.clear()
    floor_rows = [r for r in controls.rows if r.target == "control-floor"]
    ceil_rows = [r for r in controls.rows if r.target == "control-ceil"]
    expected = sorted(n for n in lengths if n % BLOCK_M)
    caught = sorted(r.length for r in floor_rows if r.verdict == "LEAK")
    at = {r.length: r for r in floor_rows}
    sdpa_at = {(r.target, r.length): r for r in real.rows}

    def row_at(target: str, n: int) -> dict[str, Any] | None:
        r = sdpa_at.get((target, n))
        return None if r is None else {"alive_bytes": r.alive_bytes, "malloc_delta": r.malloc_delta,
                                       "ms": round(r.ms, 3), "max_abs_err": r.max_abs_err, "verdict": r.verdict}

    malloc_max = max((max(r.malloc_delta) for r in real.rows if r.malloc_delta), default=None)
    leak_1023 = at[1023].alive_bytes[-1] // max(1, repeats) if 1023 in at else None
    data: dict[str, Any] = {
        "article": ARTICLE,
        "config": {"heads": heads, "head_dim": cfg.head_dim, "dtype": cfg.dtype, "repeats": repeats,
                   "block_m": BLOCK_M, "lengths": lengths},
        "sdpa": {
            "targets": real.targets,
            "notes": real.notes,
            "ok": real.ok,
            "verdict": real.verdict(),
            "max_alive_bytes": max((max(r.alive_bytes) for r in real.rows), default=0),
            "max_malloc_delta": malloc_max,
            "max_abs_err": max((r.max_abs_err or 0.0) for r in real.rows),
            "at_1023": {t: row_at(t, 1023) for t in real.targets},
            "at_1024": {t: row_at(t, 1024) for t in real.targets},
            "rows": [r.to_dict() for r in real.rows],
            "seconds": round(real.seconds, 2),
        },
        "control_floor": {
            "expected_leak_lengths": expected,
            "caught_lengths": caught,
            "exact": caught == expected,
            "alive_bytes_per_call_at_1023": leak_1023,
            "holder_chain": next((r.holder_chain for r in floor_rows if r.holder_chain), None),
            "verdict": controls.verdict(),
        },
        "control_ceil": {
            "clean": all(r.verdict in ("ok", "one-time") for r in ceil_rows),
            "bad_lengths": [r.length for r in ceil_rows if r.verdict not in ("ok", "one-time")],
        },
        "seconds": round(time.perf_counter() - t0, 2),
    }
    chain = data["control_floor"]["holder_chain"] or []
    data["ok"] = bool(
        data["control_floor"]["exact"] and data["control_ceil"]["clean"]
        and chain and chain[0].startswith(f"module {__name__}: _STAGED")
    )
    data["claim_reproduced"] = not real.ok
    return data


def render(data: dict[str, Any], out: Reporter) -> None:
    a, s, f, c = data["article"], data["sdpa"], data["control_floor"], data["control_ceil"]
    cfg = data["config"]
    out.text(f"article: FlashAttention-2 leaks ≈{a['leak_mb']} MB per call at length {a['length']} "
             f"({a['blocks_freed']} of {a['blocks_needed']} blocks freed: floor division), none at {a['clean_length']}")
    out.text(f"here: CPU (1 thread), batch 1, {cfg['heads']} heads, head dim {cfg['head_dim']}, {cfg['dtype']}, "
             f"causal; {len(cfg['lengths'])} lengths (2^k-1, 2^k, 2^k+1 up to {cfg['lengths'][-1]}), "
             f"{cfg['repeats']} calls each")
    out.text("")
    out.text(f"PyTorch SDPA ({', '.join(s['targets'])}): {s['verdict']}")
    out.text(f"  largest: {s['max_alive_bytes']} bytes alive after a call (ledger), "
             f"{s['max_malloc_delta']} bytes above the allocator baseline, error {s['max_abs_err']:.1e}")
    for t in s["targets"]:
        r1, r2 = s["at_1023"].get(t), s["at_1024"].get(t)
        if r1 and r2:
            out.text(f"  {t}: length 1023 → alive {r1['alive_bytes']} B, malloc Δ {r1['malloc_delta']} B, "
                     f"{r1['ms']} ms; length 1024 → alive {r2['alive_bytes']} B, malloc Δ {r2['malloc_delta']} B, "
                     f"{r2['ms']} ms")
    for n in s["notes"]:
        out.text(f"  note: {n}")
    out.text("")
    out.text(f"control (floor-division release, the article's mechanism): caught at {len(f['caught_lengths'])} "
             f"lengths, exactly the {len(f['expected_leak_lengths'])} that are not multiples of {cfg['block_m']}: "
             f"{f['exact']}; {f['alive_bytes_per_call_at_1023']:,} bytes per call still alive at 1023, none at 1024")
    out.text("  held by: " + (" → ".join(f["holder_chain"]) if f["holder_chain"] else "(no chain)"))
    out.text(f"fix (ceil-division release): clean at every length: {c['clean']}"
             + (f" (bad at {c['bad_lengths']})" if c["bad_lengths"] else ""))
    out.text("")
    out.text("FlashAttention-2's source launches (seqlen_q + kBlockM - 1) / kBlockM row blocks (a ceiling) and masks "
             "the partial block; its kernels allocate nothing. A kernel that skipped the last block would give wrong "
             "rows, not a leak. The GPU side is not measured here (no GPU); on one run:")
    out.text("  kv-guardian sweep --device cuda --attn sdpa --attn flash-attn")
    verdict_line(out, f"the article's claim {'REPRODUCES' if data['claim_reproduced'] else 'does not reproduce'} on "
                 f"this machine's SDPA; the sweep catches the claimed mechanism: {data['ok']}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-length", type=int, default=2048, help="sweep 2^k±1 up to this (default: %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="measured calls per length (default: %(default)s)")


def run(args: argparse.Namespace) -> ReproResult:
    if not 1024 <= args.max_length <= 16384:
        raise UsageError(f"--max-length {args.max_length} is out of range; fix: use 1024..16384 (1023 must be in)")
    if not 1 <= args.heads <= 64 or not 1 <= args.repeats <= 20:
        raise UsageError("--heads must be 1..64 and --repeats 1..20; fix: e.g. --heads 4 --repeats 3")
    data = measure(max_length=args.max_length, heads=args.heads, repeats=args.repeats)
    return ReproResult(NAME, SECTION, TITLE, data, render, ok=data["ok"])


def demo_row() -> DemoRow:
    data = measure(max_length=DEMO_MAX_LENGTH, heads=2, repeats=2)
    s, f, c = data["sdpa"], data["control_floor"], data["control_ceil"]
    n = len(data["config"]["lengths"])
    r1 = {t: s["at_1023"][t]["malloc_delta"][-1] for t in s["targets"] if s["at_1023"].get(t)}
    r2 = {t: s["at_1024"][t]["malloc_delta"][-1] for t in s["targets"] if s["at_1024"].get(t)}
    measured = (
        f"SDPA {'+'.join(t.removeprefix('sdpa-') for t in s['targets'])} (CPU), {n} lengths 1…"
        f"{data['config']['lengths'][-1]}: "
        f"{s['max_alive_bytes']} B alive after any call, allocator ≤{s['max_malloc_delta']:,} B over baseline "
        f"(1023: {max(r1.values(), default=0):,} B; 1024: {max(r2.values(), default=0):,} B) → "
        + ("leak REPRODUCED" if data["claim_reproduced"] else "claim does not reproduce")
    )
    chain = f["holder_chain"] or ["(no chain)"]
    verdict = (
        f"sweep {'FAIL' if data['claim_reproduced'] else 'PASS'} on SDPA; floor-division control caught at "
        f"{len(f['caught_lengths'])}/{n} lengths (= every non-multiple of {BLOCK_M}: {f['exact']}), "
        f"{f['alive_bytes_per_call_at_1023']:,} B/call at 1023, held by {chain[0]}"
    )
    return DemoRow(
        name=NAME,
        section=SECTION,
        article_claim="FlashAttention-2 leaks ≈151 MB at length 1023 (floor(1023/64)=15 blocks freed), none at 1024",
        measured=measured,
        verdict=verdict,
        fix_verified=c["clean"],
        ok=data["ok"],
        details={"sdpa_targets": s["targets"], "caught_lengths": f["caught_lengths"]},
    )
