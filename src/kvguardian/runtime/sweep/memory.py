"""Memory probes for the sweep: the C allocator's in-use bytes (glibc) and CUDA's allocator and driver.

The ledger proves whether a K/V storage outlived a call; these probes answer whether the call left memory
allocated at all (its own workspaces included): glibc's ``mallinfo2`` (where PyTorch's CPU tensors live; not
available with musl, macOS or a replaced allocator) and, on CUDA, ``memory_allocated``, ``memory_reserved`` and
the driver's used bytes. What each number shows: docs/design/sweep.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["CudaProbe", "MallocProbe"]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]


class MallocProbe:
    """In-use bytes of glibc's malloc, or unavailable (``available`` False, ``why`` says why)."""

    name = "malloc"

    def __init__(self) -> None:
        self.available = False
        self.why = ""
        self._fn: Any = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            fn = libc.mallinfo2
        except (OSError, AttributeError) as exc:
            self.why = f"glibc mallinfo2 not available ({exc}); the C allocator is not glibc >= 2.33"
            return
        fn.restype = _MallInfo2
        fn.argtypes = []
        self._fn = fn
        self.available = True

    def read(self) -> int | None:
        if not self.available:
            return None
        info = self._fn()
        return int(info.uordblks + info.hblkhd)


class CudaProbe:
    """PyTorch CUDA allocator and driver bytes for one device; unavailable without CUDA."""

    name = "cuda"

    def __init__(self, device: torch.device) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.available = bool(torch.cuda.is_available() and getattr(device, "type", str(device)) == "cuda")
        self.why = "" if self.available else "no CUDA device in use"

    def read(self) -> dict[str, int] | None:
        if not self.available:
            return None
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        free, total = cuda.mem_get_info(self.device)
        return {
            "allocated": int(cuda.memory_allocated(self.device)),
            "reserved": int(cuda.memory_reserved(self.device)),
            "driver_used": int(total - free),
        }

    def reset_peak(self) -> None:
        if self.available:
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int | None:
        if not self.available:
            return None
        return int(self.torch.cuda.max_memory_allocated(self.device))
