"""cgroup v2 memory of a cgroup: ``memory.current`` minus ``inactive_file`` (``memory.stat``), over ``memory.max``.

That difference is the working set (what kubelet and cAdvisor evict on): inactive page cache is reclaimed
before the OOM killer runs, so counting it would drain a server for memory the kernel gives back by itself.
The limit is the lowest ``memory.max`` of the cgroup and its ancestors up to the mount (a child without a
limit still lives inside its parent's). ``memory.events`` ``oom_kill`` counts the kernel's OOM kills.
"""

from __future__ import annotations

from pathlib import Path

from kvguardian.ops.oom.signals.base import Reading, failed
from kvguardian.ops.oom.signals.cgroupfs import CgroupFiles, version_of

__all__ = ["CgroupV2Signal", "parse_keyed"]


def parse_keyed(text: str) -> dict[str, int]:
    """A flat keyed file (``memory.stat``, ``memory.events``): ``name value`` per line."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[name] = int(value)
    return out


class CgroupV2Signal:
    """Read-only view of one cgroup v2 directory."""

    fast = False

    def __init__(self, path: Path | str, *, name: str = "cgroup", top: Path | str | None = None) -> None:
        self.path = Path(path)
        if version_of(self.path) != 2:
            from kvguardian.core.errors import UsageError

            raise UsageError(f"{self.path} is a cgroup v1 directory; fix: use CgroupV1Signal (or cgroup_signal())")
        self.name = name
        self.top = Path(top) if top is not None else None  # stop the limit walk here (the mount point)
        self.files = CgroupFiles(self.path)
        self._limits = self._limit_files()

    def _limit_files(self) -> list[CgroupFiles]:
        """The cgroup and its ancestors that have a ``memory.max`` (up to ``top`` or the mount)."""
        out = [self.files]
        d = self.path
        while d.parent != d and not (self.top is not None and d == self.top):
            d = d.parent
            if not (d / "memory.max").exists():
                break
            out.append(CgroupFiles(d))
        return out

    def __repr__(self) -> str:
        return f"<CgroupV2Signal {self.path}>"

    def limit(self) -> int | None:
        """The lowest ``memory.max`` from this cgroup up to the mount; None when none is set."""
        best: int | None = None
        for f in self._limits:
            text = f.read("memory.max").strip()
            if text != "max":
                best = int(text) if best is None else min(best, int(text))
        return best

    def read(self) -> Reading:
        source = f"{self.path} (cgroup v2)"
        try:
            f = self.files
            current = int(f.read("memory.current"))
            stat = parse_keyed(f.read("memory.stat"))
            events = parse_keyed(f.read("memory.events")) if f.exists("memory.events") else {}
            inactive = stat.get("inactive_file", 0)
            return Reading(self.name, max(current - inactive, 0), self.limit(), source, extra={
                "current": current, "inactive_file": inactive,
                "oom_kill": events.get("oom_kill", 0), "oom": events.get("oom", 0), "max_events": events.get("max", 0),
            })
        except (OSError, ValueError) as exc:
            return failed(self.name, source, exc)
