"""Memory signals, one small read-only module each: cgroup v2, cgroup v1, CUDA, NVML, a paged pool's
occupancy, and the ledger's KV bytes against a KV budget. Each reports used / limit / source (`Reading`)."""

from __future__ import annotations

from kvguardian.oom.signals.base import Reading, Signal, SignalUnavailable
from kvguardian.oom.signals.cgroup import cgroup_signal, cgroup_signal_for_pid, cgroup_signal_for_pod
from kvguardian.oom.signals.cgroup_v1 import CgroupV1Signal
from kvguardian.oom.signals.cgroup_v2 import CgroupV2Signal
from kvguardian.oom.signals.cuda import CudaSignal
from kvguardian.oom.signals.ledger import LedgerBudgetSignal
from kvguardian.oom.signals.nvml import NvmlSignal
from kvguardian.oom.signals.pool import PoolSignal

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
