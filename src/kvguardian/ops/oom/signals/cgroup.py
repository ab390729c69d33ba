"""Build the right cgroup signal (v1 or v2) for a directory, a PID, or a Kubernetes pod."""

from __future__ import annotations

from pathlib import Path

from kvguardian.ops.oom.signals.cgroup_v1 import CgroupV1Signal
from kvguardian.ops.oom.signals.cgroup_v2 import CgroupV2Signal
from kvguardian.ops.oom.signals.cgroupfs import locate, pod_cgroup, version_of

__all__ = ["cgroup_signal", "cgroup_signal_for_pid", "cgroup_signal_for_pod"]


def cgroup_signal(path: Path | str, *, name: str = "cgroup") -> CgroupV1Signal | CgroupV2Signal:
    """The signal of cgroup directory ``path`` (its version read from the files it has)."""
    return CgroupV2Signal(path, name=name) if version_of(path) == 2 else CgroupV1Signal(path, name=name)


def cgroup_signal_for_pid(pid: int | str = "self", *, root: Path | str = "/",
                          name: str = "cgroup") -> CgroupV1Signal | CgroupV2Signal:
    """The signal of process ``pid``'s memory cgroup, found through ``/proc/PID/cgroup``."""
    loc = locate(pid, root=root)
    return CgroupV2Signal(loc.path, name=name) if loc.version == 2 else CgroupV1Signal(loc.path, name=name)


def cgroup_signal_for_pod(pod_uid: str, cgroup_root: Path | str, *,
                          name: str = "cgroup") -> CgroupV1Signal | CgroupV2Signal:
    """The signal of a Kubernetes pod's cgroup (every container of the pod together), by pod UID."""
    return cgroup_signal(pod_cgroup(pod_uid, cgroup_root), name=name)
