"""GPU memory of one device through NVML (``nvidia-ml-py``): ``nvmlDeviceGetMemoryInfo`` used / total.

NVML sees every process on the device (other containers included) without a CUDA context, so a sidecar can
watch a GPU it never allocates on. Built only where the NVML library loads; tests pass a fake ``pynvml``.
`device_memory` is what the device plugin advertises from.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvguardian.ops.oom.signals.base import Reading, SignalUnavailable, failed

__all__ = ["Nvml", "NvmlSignal", "device_memory", "load_nvml"]


class Nvml(Protocol):
    """What is used of the ``pynvml`` module (or a test's fake of it)."""

    def nvmlInit(self) -> object: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Any: ...


def load_nvml(nvml: Nvml | None = None) -> Nvml:
    """The initialised ``pynvml`` module (or ``nvml`` as given).

    Raises:
        SignalUnavailable: nvidia-ml-py is not installed, or the NVML library (libnvidia-ml.so.1, part of the
            driver) does not load.
    """
    if nvml is None:
        try:
            import pynvml as nvml_mod
        except ImportError:
            raise SignalUnavailable("NVML needs the Python package nvidia-ml-py, which is not installed; fix: pip "
                                    "install 'kv-guardian[gpu]'") from None
        nvml = nvml_mod
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        raise SignalUnavailable(f"NVML is not available ({type(exc).__name__}: {exc}): no NVIDIA driver on this "
                                "machine or not mounted into the container; fix: run on a GPU node with the "
                                "NVIDIA container runtime, or give the size explicitly") from None
    return nvml


def device_memory(nvml: Nvml | None = None) -> list[int]:
    """Total memory in bytes of every GPU NVML sees, by index."""
    nvml = load_nvml(nvml)
    n = int(nvml.nvmlDeviceGetCount())
    return [int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).total) for i in range(n)]


class NvmlSignal:
    fast = False

    def __init__(self, index: int = 0, *, nvml: Nvml | None = None, name: str | None = None) -> None:
        self.nvml = load_nvml(nvml)
        count = int(self.nvml.nvmlDeviceGetCount())
        if not 0 <= index < count:
            raise SignalUnavailable(f"GPU {index} does not exist (NVML sees {count}); fix: pick 0..{count - 1}")
        self.index = index
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        self.name = name or f"nvml:{index}"

    def __repr__(self) -> str:
        return f"<NvmlSignal {self.name}>"

    def read(self) -> Reading:
        try:
            info = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
            return Reading(self.name, int(info.used), int(info.total), "nvml", extra={"free": float(info.free)})
        except Exception as exc:  # fail-open (a GPU that fell off the bus raises NVMLError_GpuIsLost)
            return failed(self.name, "nvml", exc)
