"""cgroup v1 memory of a cgroup: ``memory.usage_in_bytes`` minus ``total_inactive_file``, over the limit.

As for v2, inactive page cache is left out (the kernel reclaims it before any OOM kill). The limit is the
lower of ``memory.limit_in_bytes`` and ``hierarchical_memory_limit`` (``memory.stat``: the tightest limit of
the cgroup and its ancestors); the kernel's "unlimited" (``PAGE_COUNTER_MAX`` pages, about 2**63) reads as no
limit. ``memory.oom_control`` gives ``oom_kill`` (kernel 4.13 and later) and ``under_oom``.
"""

from __future__ import annotations

from pathlib import Path

from kvguardian.core.errors import UsageError
from kvguardian.ops.oom.signals.base import Reading, failed
from kvguardian.ops.oom.signals.cgroup_v2 import parse_keyed
from kvguardian.ops.oom.signals.cgroupfs import CgroupFiles, version_of

__all__ = ["UNLIMITED_FROM", "CgroupV1Signal"]

#: limits at or above this are the kernel's "no limit" (it prints PAGE_COUNTER_MAX * page size)
UNLIMITED_FROM = 1 << 62


class CgroupV1Signal:
    """Read-only view of one cgroup v1 memory directory."""

    fast = False

    def __init__(self, path: Path | str, *, name: str = "cgroup") -> None:
        self.path = Path(path)
        if version_of(self.path) != 1:
            raise UsageError(f"{self.path} is a cgroup v2 directory; fix: use CgroupV2Signal (or cgroup_signal())")
        self.name = name
        self.files = CgroupFiles(self.path)

    def __repr__(self) -> str:
        return f"<CgroupV1Signal {self.path}>"

    def read(self) -> Reading:
        source = f"{self.path} (cgroup v1)"
        try:
            f = self.files
            usage = int(f.read("memory.usage_in_bytes"))
            stat = parse_keyed(f.read("memory.stat"))
            limits = [int(f.read("memory.limit_in_bytes"))]
            if "hierarchical_memory_limit" in stat:
                limits.append(stat["hierarchical_memory_limit"])
            limit = min(limits)
            oom = parse_keyed(f.read("memory.oom_control")) if f.exists("memory.oom_control") else {}
            inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
            return Reading(self.name, max(usage - inactive, 0), limit if limit < UNLIMITED_FROM else None, source,
                           extra={"current": usage, "inactive_file": inactive, "oom_kill": oom.get("oom_kill", 0),
                                  "under_oom": oom.get("under_oom", 0)})
        except (OSError, ValueError) as exc:
            return failed(self.name, source, exc)
