"""Memory signals, one small read-only module each: cgroup v2, cgroup v1, CUDA, NVML, a paged pool's
occupancy, and the ledger's KV bytes against a KV budget. Each reports used / limit / source (`Reading`)."""

from __future__ import annotations

from kvguardian.ops.oom.signals.base import Reading, Signal, SignalUnavailable
from kvguardian.ops.oom.signals.cgroup import cgroup_signal, cgroup_signal_for_pid, cgroup_signal_for_pod
from kvguardian.ops.oom.signals.cgroup_v1 import CgroupV1Signal
from kvguardian.ops.oom.signals.cgroup_v2 import CgroupV2Signal
from kvguardian.ops.oom.signals.cuda import CudaSignal
from kvguardian.ops.oom.signals.ledger import LedgerBudgetSignal
from kvguardian.ops.oom.signals.nvml import NvmlSignal
from kvguardian.ops.oom.signals.pool import PoolSignal

__all__ = [
    "CgroupV1Signal",
    "CgroupV2Signal",
    "CudaSignal",
    "LedgerBudgetSignal",
    "NvmlSignal",
    "PoolSignal",
    "Reading",
    "Signal",
    "SignalUnavailable",
    "cgroup_signal",
    "cgroup_signal_for_pid",
    "cgroup_signal_for_pod",
]
