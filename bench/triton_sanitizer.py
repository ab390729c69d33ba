"""Cost of the Triton KV-ownership sanitizer: writes bench/results/triton_sanitizer.json.

The paged decode-attention kernel (`kvguardian.triton.paged_attention`) with and without `sanitize`, on a
batch shaped like real decode: sequences of 128-1,000 tokens, block size 16, 32 query heads over 8 KV heads
(GQA), head_dim 128, fp16 on a GPU (fp32 on the CPU). Pairs are interleaved (plain, sanitized, plain, ...)
and the ratio is taken per pair; the JSON gives the median ratio and both medians.

- CPU (``TRITON_INTERPRET=1``, the only mode here): Triton's interpreter runs each program in Python, so
  absolute times say nothing about a GPU; the sizes are scaled down (``--quick`` default on CPU) and the
  ratio shows what the check costs the interpreter.
- GPU (when torch sees CUDA and TRITON_INTERPRET is unset): the same kernels compiled, timed with
  ``triton.testing.do_bench``. Target (issue 15): sanitized <= 1.5x the kernel time. No GPU was lent to the
  session that wrote this; the path is written and guarded, not yet measured.

    TRITON_INTERPRET=1 .venv-triton/bin/python bench/triton_sanitizer.py [--pairs 5] [--out FILE]
    .venv-triton/bin/python bench/triton_sanitizer.py --device cuda        # on a GPU machine
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

from results_io import write_json


def _batch(device: str, quick: bool) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    if quick:
        lens, heads, kv_heads, head_dim = [37, 64, 100, 128], 8, 2, 32
    else:
        lens, heads, kv_heads, head_dim = [128, 300, 512, 777, 1000, 200, 640, 999], 32, 8, 128
    bs = 16
    dtype = torch.float16 if device == "cuda" else torch.float32
    blocks = sum(-(-n // bs) for n in lens) + 8
    perm = torch.randperm(blocks, generator=g)  # scattered blocks, as a pool hands them out
    width = max(-(-n // bs) for n in lens)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(lens):
        nb = -(-n // bs)
        bt[i, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
    shape = (blocks, bs, kv_heads, head_dim)
    return {
        "q": torch.randn(len(lens), heads, head_dim, generator=g).to(device, dtype),
        "k": torch.randn(shape, generator=g).to(device, dtype),
        "v": torch.randn(shape, generator=g).to(device, dtype),
        "bt": bt.to(device), "sl": torch.tensor(lens, dtype=torch.int32, device=device),
        "shape": {"seq_lens": lens, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "block_size": bs,
                  "dtype": str(dtype).replace("torch.", "")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--full", action="store_true", help="real decode sizes on the CPU too (slow in the interpreter)")
    ap.add_argument("--out", default="bench/results/triton_sanitizer.json")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from kvguardian.triton import paged_decode, sanitize
    from kvguardian.triton.paged_attention import paged_decode_kernel

    if args.device == "cuda" and (not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        raise SystemExit("bench/triton_sanitizer.py: --device cuda needs a CUDA GPU and TRITON_INTERPRET unset")
    b = _batch(args.device, quick=args.device == "cpu" and not args.full)
    checked = sanitize(paged_decode_kernel, kv_caches=("k_cache", "v_cache"), block_table="block_table",
                       seq_lens="seq_lens", block_size="BLOCK_SIZE")

    def plain() -> Any:
        return paged_decode(b["q"], b["k"], b["v"], b["bt"], b["sl"])

    def sanitized() -> Any:
        return paged_decode(b["q"], b["k"], b["v"], b["bt"], b["sl"], kernel=checked)

    identical = bool(torch.equal(plain(), sanitized()))  # also warms both up (compiles on a GPU)
    t_plain, t_san = [], []
    for _ in range(args.pairs):
        for fn, sink in ((plain, t_plain), (sanitized, t_san)):
            if args.device == "cuda":
                import triton

                sink.append(triton.testing.do_bench(fn) / 1e3)
            else:
                t0 = time.process_time()
                fn()
                sink.append(time.process_time() - t0)
    ratios = [s / p for p, s in zip(t_plain, t_san)]
    out = {
        "benchmark": "triton_sanitizer",
        "mode": "gpu" if args.device == "cuda" else "interpret (TRITON_INTERPRET=1, CPU)",
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        "batch": b["shape"],
        "pairs": args.pairs,
        "kernel_s_median": statistics.median(t_plain),
        "sanitized_s_median": statistics.median(t_san),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_all": [round(r, 3) for r in ratios],
        "outputs_bit_identical": identical,
        "violations": len(checked.findings()),
        "target_gpu_ratio": 1.5,
        "clock": "triton.testing.do_bench" if args.device == "cuda" else "process_time",
        "loadavg": os.getloadavg(),
    }
    write_json(args.out, out)


if __name__ == "__main__":
    main()
