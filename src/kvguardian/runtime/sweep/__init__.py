"""``kv-guardian sweep``: run an attention callable at every length around every power of two and prove that
memory returns to its baseline after each call (the article's §2.3 claim, as a reusable tool).

    from kvguardian.runtime.sweep import SweepConfig, resolve_targets, run_sweep, parse_lengths
    targets, notes = resolve_targets(["sdpa"], device=torch.device("cpu"), dtype=torch.float32)
    result = run_sweep(targets, parse_lengths("pow2"), SweepConfig())
    print(result.verdict())

Importing this package does not import torch.
"""

from kvguardian.runtime.sweep.lengths import around_powers_of_two, length_kind, parse_lengths
from kvguardian.runtime.sweep.run import Row, SweepConfig, SweepResult, run_sweep
from kvguardian.runtime.sweep.targets import LAYOUTS, Target, resolve_targets

__all__ = [
    "LAYOUTS",
    "Row",
    "SweepConfig",
    "SweepResult",
    "Target",
    "around_powers_of_two",
    "length_kind",
    "parse_lengths",
    "resolve_targets",
    "run_sweep",
]
