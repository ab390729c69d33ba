"""CUDA memory of one device as this process's driver sees it: ``torch.cuda.mem_get_info`` (free, total).

used = total - free counts every process on the device, which is what runs out; the caching allocator's
reserved and allocated bytes of this process are reported beside it (``extra``): reserved minus allocated is
what ``torch.cuda.empty_cache()`` could give back. Built only where torch sees a CUDA device; tests pass a
fake ``torch`` module.
"""

from __future__ import annotations

import types

from kvguardian.ops.oom.signals.base import Reading, SignalUnavailable, failed

__all__ = ["CudaSignal"]


class CudaSignal:
    fast = False

    def __init__(self, device: int = 0, *, torch: types.ModuleType | None = None, name: str | None = None) -> None:
        if torch is None:
            try:
                import torch as torch_mod
            except ImportError:
                raise SignalUnavailable("the CUDA signal needs torch, which is not installed; fix: pip install "
                                        "'kv-guardian[torch]' or leave the CUDA signal out") from None
            torch = torch_mod
        try:
            available = bool(torch.cuda.is_available())
            count = int(torch.cuda.device_count()) if available else 0
        except Exception as exc:  # a broken driver install raises here
            raise SignalUnavailable(f"CUDA is not usable ({type(exc).__name__}: {exc}); fix: check the NVIDIA driver "
                                    "or leave the CUDA signal out") from None
        if not available:
            raise SignalUnavailable("CUDA is not available (torch.cuda.is_available() is False: no GPU, or a CPU "
                                    "build of torch); fix: leave the CUDA signal out on this machine")
        if not 0 <= device < count:
            raise SignalUnavailable(f"CUDA device {device} does not exist ({count} visible); fix: pick 0..{count - 1}")
        self.torch = torch
        self.device = device
        self.name = name or f"cuda:{device}"

    def __repr__(self) -> str:
        return f"<CudaSignal {self.name}>"

    def read(self) -> Reading:
        try:
            cuda = self.torch.cuda
            free, total = cuda.mem_get_info(self.device)
            return Reading(self.name, int(total) - int(free), int(total), "torch.cuda.mem_get_info", extra={
                "reserved": float(cuda.memory_reserved(self.device)),
                "allocated": float(cuda.memory_allocated(self.device)),
            })
        except Exception as exc:  # fail-open: the reading says what went wrong
            return failed(self.name, "torch.cuda.mem_get_info", exc)
