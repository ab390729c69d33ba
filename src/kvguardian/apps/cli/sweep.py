"""``kv-guardian sweep``: does an attention callable give back its memory at every sequence length?

Runs the callable at every length around every power of two (2^k-1, 2^k, 2^k+1 up to 2048 by default) and
checks, after each call, the ledger (storages the callable received or returned that are still alive), the
C allocator's in-use bytes, and CUDA's allocated bytes on a GPU. Prints a table per target and a verdict;
exits 1 when a length leaks or computes a wrong result.

On a GPU with flash-attn installed:

    kv-guardian sweep --device cuda --dtype float16 --attn flash-attn
    kv-guardian sweep --device cuda --dtype bfloat16 --attn flash_attn:flash_attn_func --layout bshd
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from kvguardian.apps.cli.options import add_format
from kvguardian.core.errors import EXIT_ENVIRONMENT, EXIT_FINDINGS, EXIT_OK, UsageError
from kvguardian.core.report.reporter import Reporter

if TYPE_CHECKING:
    from kvguardian.runtime.sweep.run import SweepResult

NAME = "sweep"
HELP = "run an attention callable at every length around each power of two and prove memory returns to baseline"
EXAMPLE = "kv-guardian sweep --attn pkg.mod:my_attention --lengths 1000-1100"

DTYPES = ("float32", "float16", "bfloat16", "float64")
SHOW = ("pow2", "all", "problems")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attn", action="append", metavar="SPEC",
        help="what to sweep (repeatable): sdpa (every backend available; default), sdpa-math, sdpa-flash, "
             "sdpa-efficient, sdpa-cudnn, paged (through the paged KV pool, when installed), flash-attn "
             "(flash_attn_varlen_func), or module:function",
    )
    p.add_argument("--layout", default="bhsd", choices=("bhsd", "bshd", "varlen"),
                   help="how a module:function target is called (default: %(default)s, SDPA's signature)")
    p.add_argument("--causal-kw", default=None, metavar="NAME",
                   help="keyword that asks a module:function target for a causal mask "
                        "(default: is_causal for bhsd, causal otherwise)")
    p.add_argument("--lengths", default="pow2",
                   help="pow2 (2^k-1, 2^k, 2^k+1 up to --max-length; default), all (1..--max-length), "
                        "or a list like 1000-1030,2047")
    p.add_argument("--max-length", type=int, default=2048, help="upper end of pow2/all (default: %(default)s)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default=None, choices=DTYPES, help="default: float32 on cpu, float16 on cuda")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for the sweep (default: torch's own choice)")
    p.add_argument("--repeats", type=int, default=3, help="measured calls per length after a warm-up (default: 3)")
    p.add_argument("--tolerance", type=int, default=64 * 1024,
                   help="allocator bytes allowed above the baseline (default: %(default)s)")
    p.add_argument("--no-check-output", action="store_true", help="skip the float64 check of the last 128 rows")
    p.add_argument("--show", default="pow2", choices=SHOW,
                   help="rows printed: pow2 (lengths next to a power of two, plus problems), all, problems")
    add_format(p, json_help="print the whole result as JSON")


def _validate(args: argparse.Namespace) -> None:
    for name, lo, hi in (("batch", 1, 64), ("heads", 1, 256), ("head_dim", 1, 512), ("repeats", 1, 100),
                         ("threads", 1, 1024)):
        value = getattr(args, name)
        if value is None:
            continue
        if not lo <= value <= hi:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {value} is out of range; fix: use {lo}..{hi}")
    if args.tolerance < 0:
        raise UsageError(f"--tolerance {args.tolerance} is negative; fix: use bytes >= 0")


def run(args: argparse.Namespace) -> int:
    from kvguardian.runtime.sweep import SweepConfig, parse_lengths, resolve_targets, run_sweep

    _validate(args)
    lengths = parse_lengths(args.lengths, max_length=args.max_length)
    try:
        import torch
    except ImportError:
        raise UsageError("kv-guardian sweep needs torch; fix: pip install 'kv-guardian[torch]'",
                         exit_code=EXIT_ENVIRONMENT) from None
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise UsageError(f"--device {args.device!r} is not a device; fix: use cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: CUDA is not available on this machine; fix: run on a GPU "
                         "machine, or use --device cpu", exit_code=EXIT_ENVIRONMENT)
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {args.device}: only cpu and cuda are supported; fix: use cpu or cuda[:N]")
    dtype_name = args.dtype or ("float16" if device.type == "cuda" else "float32")
    config = SweepConfig(batch=args.batch, heads=args.heads, head_dim=args.head_dim, dtype=dtype_name,
                         device=str(device), repeats=args.repeats, tolerance=args.tolerance,
                         check_output=not args.no_check_output)
    targets, notes = resolve_targets(args.attn or ["sdpa"], device=device, dtype=getattr(torch, dtype_name),
                                     layout=args.layout, causal_kw=args.causal_kw)
    if not targets:
        raise UsageError(f"no attention target runs on {device}: " + "; ".join(notes), exit_code=EXIT_ENVIRONMENT)
    from kvguardian.apps.repro.threads import torch_threads
    from kvguardian.core.report.console import ConsoleReporter
    from kvguardian.core.report.reporter import reporting

    err = ConsoleReporter(stderr=True)
    with torch_threads(args.threads or torch.get_num_threads()):
        result = run_sweep(targets, lengths, config, notes=notes, progress=None if args.format == "json" else err.text)
    with reporting("json" if args.format == "json" else "console") as out:
        render(result, out, show=args.show)
        out.result(result.to_dict())
    return EXIT_OK if result.ok else EXIT_FINDINGS


def _fmt_bytes(values: list[int] | None) -> str:
    if values is None:
        return "n/a"
    return " ".join(f"{v:+,}" for v in values)


def render(result: object, out: Reporter, *, show: str = "pow2") -> None:
    """One table per target, the notes, and the verdict."""
    from kvguardian.runtime.sweep.run import SweepResult

    assert isinstance(result, SweepResult)
    cfg = result.config
    out.text(
        f"kv-guardian sweep: batch {cfg.batch}, {cfg.heads} heads, head dim {cfg.head_dim}, {cfg.dtype} on "
        f"{cfg.device}, causal; {cfg.repeats} calls per length after a warm-up; tolerance {cfg.tolerance:,} bytes")
    out.text("probes: " + ", ".join(f"{k}: {v}" for k, v in result.probes.items()))
    out.text("columns: alive B = bytes of the storages the call received or returned still alive after it (ledger), "
             "one value per call; malloc/CUDA Δ B = allocated bytes above the baseline after each call; err = max "
             "|out - float64 reference| over the last 128 rows")
    cuda = any(r.cuda_allocated_delta is not None for r in result.rows)
    for target in result.targets:
        _target_table(result, target, out, show=show, cuda=cuda)
    for note in result.notes:
        out.text(f"note: {note}")
    out.text(f"verdict: {result.verdict()} ({result.seconds:.1f} s)")


def _shown(rows: list[Any], show: str) -> list[Any]:
    if show == "problems":
        return [r for r in rows if r.verdict != "ok"]
    if show == "pow2":
        return [r for r in rows if r.kind != "other" or r.verdict != "ok"]
    return rows


def _target_table(result: SweepResult, target: str, out: Reporter, *, show: str, cuda: bool) -> None:
    """The table of one target's lengths, then the reasons of its first three problems."""
    every = [r for r in result.rows if r.target == target]
    rows = _shown(every, show)
    cols = ["len", "kind", "ms", "K+V B", "alive B", "malloc Δ B"]
    if cuda:
        cols += ["CUDA alloc Δ B", "reserved Δ B", "driver Δ B"]
    cols += ["err", "verdict"]
    table = []
    for r in rows:
        line = [r.length, r.kind, f"{r.ms:.2f}", f"{r.kv_bytes:,}", _fmt_bytes(r.alive_bytes),
                _fmt_bytes(r.malloc_delta)]
        if cuda:
            line += [_fmt_bytes(r.cuda_allocated_delta), _fmt_bytes(r.cuda_reserved_delta),
                     _fmt_bytes(r.cuda_driver_delta)]
        line += ["—" if r.max_abs_err is None else f"{r.max_abs_err:.1e}", r.verdict]
        table.append(line)
    out.table(f"{target}: {len(rows)} of {len(every)} lengths shown", cols, table)
    for r in [r for r in every if r.verdict in ("LEAK", "WRONG", "ERROR")][:3]:
        out.text(f"  length {r.length}: " + "; ".join(r.reasons))
        if r.holder_chain:
            out.text("    held by: " + " → ".join(r.holder_chain))
