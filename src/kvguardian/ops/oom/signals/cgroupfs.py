"""Find a process's memory cgroup the way the kernel names it: ``/proc/PID/cgroup`` plus ``/proc/PID/mountinfo``.

``/proc/PID/cgroup`` gives the cgroup's path inside each hierarchy (``0::/kubepods/...`` for cgroup v2,
``4:memory:/...`` for the v1 memory controller); ``mountinfo`` gives where that hierarchy is mounted and
which part of it the mount shows (its root). The directory is the mount point plus the cgroup path below the
mount's root. cgroup v2 is used when the process's v2 cgroup has the memory controller (``memory.current``
exists); otherwise the v1 memory hierarchy. Everything is read under ``root`` so that tests can lay out a
file tree like procfs and cgroupfs.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from kvguardian.core.errors import UsageError

__all__ = ["CgroupFiles", "CgroupLocation", "Mount", "locate", "parse_mountinfo", "parse_proc_cgroup", "pod_cgroup",
           "version_of"]

_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One cgroup mount from mountinfo."""

    fstype: str  # "cgroup" (v1) or "cgroup2"
    root: str  # the part of the hierarchy this mount shows
    point: str  # where it is mounted
    options: frozenset[str]  # super options (v1: the controllers, e.g. "memory")


@dataclass(frozen=True)
class CgroupLocation:
    version: int  # 1 or 2
    path: Path  # the cgroup's directory
    cgroup: str  # its path inside the hierarchy, as /proc/PID/cgroup says


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m[1], 8)), field)


def parse_proc_cgroup(text: str) -> list[tuple[str, frozenset[str], str]]:
    """``(hierarchy id, controllers, path)`` per line of ``/proc/PID/cgroup``."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[0], frozenset(c for c in parts[1].split(",") if c), parts[2]))
    return out


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts of a ``/proc/PID/mountinfo``."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(Mount(tail[0], _unescape(fields[3]), _unescape(fields[4]), frozenset(tail[2].split(","))))
    return mounts


def _below(root: Path, mount: Mount, cgroup: str) -> Path | None:
    mroot = mount.root.rstrip("/")
    if mroot and not (cgroup == mroot or cgroup.startswith(mroot + "/")):
        return None  # the cgroup is outside what this mount shows (another cgroup namespace)
    rel = cgroup[len(mroot):].lstrip("/")
    return root / mount.point.lstrip("/") / rel


def _read(path: Path, what: str, fix: str) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise UsageError(f"{what}: {path} does not exist; fix: {fix}") from None
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path} ({exc.strerror or exc}); fix: {fix}") from None


def locate(pid: int | str = "self", *, root: Path | str = "/") -> CgroupLocation:
    """The memory cgroup of process ``pid`` ("self" for this one).

    Raises:
        UsageError: no such process, or neither a v2 cgroup with the memory controller nor a v1 memory
            hierarchy is visible.
    """
    root = Path(root)
    proc = root / "proc" / str(pid)
    fix = "pass the PID of a running process (or --cgroup PATH)"
    entries = parse_proc_cgroup(_read(proc / "cgroup", f"process {pid}", fix))
    mounts = parse_mountinfo(_read(proc / "mountinfo", f"process {pid}", fix))
    v2 = next((p for h, c, p in entries if h == "0" and not c), None)
    if v2 is not None:
        for m in mounts:
            if m.fstype == "cgroup2":
                path = _below(root, m, v2)
                if path is not None and (path / "memory.current").exists():
                    return CgroupLocation(2, path, v2)
    v1 = next((p for _, c, p in entries if "memory" in c), None)
    if v1 is not None:
        for m in mounts:
            if m.fstype == "cgroup" and "memory" in m.options:
                path = _below(root, m, v1)
                if path is not None and path.is_dir():
                    return CgroupLocation(1, path, v1)
    raise UsageError(
        f"process {pid}: no memory cgroup is visible (cgroup v2 without the memory controller and no cgroup v1 "
        "memory hierarchy mounted); fix: run it in a container with a memory limit, or pass --cgroup PATH"
    )


def version_of(path: Path | str) -> int:
    """1 or 2, from the files in a cgroup directory.

    Raises:
        UsageError: the directory does not exist or is not a memory cgroup.
    """
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"cgroup {path} does not exist; fix: pass a cgroup directory, e.g. "
                         "/sys/fs/cgroup/memory/<group> (v1) or /sys/fs/cgroup/<group> (v2)")
    if (path / "memory.current").exists():
        return 2
    if (path / "memory.usage_in_bytes").exists():
        return 1
    raise UsageError(f"{path} is not a memory cgroup (no memory.current or memory.usage_in_bytes); fix: pass the "
                     "directory of a cgroup that has the memory controller")


def pod_cgroup(pod_uid: str, cgroup_root: Path | str) -> Path:
    """The cgroup directory of a Kubernetes pod, found under a (host's) cgroupfs by the pod's UID: both the
    cgroupfs driver (``kubepods/burstable/pod<uid>``) and the systemd driver
    (``kubepods-burstable-pod<uid with underscores>.slice``) name it after the UID.

    Raises:
        UsageError: the UID is malformed, or no such directory (or more than one) is found.
    """
    if not re.fullmatch(r"[0-9a-fA-F-]{8,64}", pod_uid or ""):
        raise UsageError(f"--pod-uid {pod_uid!r} is not a pod UID; fix: pass metadata.uid through the downward API")
    base = Path(cgroup_root)
    if not base.is_dir():
        raise UsageError(f"--cgroup-root {base} does not exist; fix: mount the node's /sys/fs/cgroup there (read-only)")
    names = {f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}"}
    found = []
    for sub in ("kubepods", "kubepods.slice"):
        top = base / sub
        if top.is_dir():
            found += [p for p in top.rglob("*pod*") if p.is_dir() and any(
                p.name == n or p.name.endswith(f"-{n}.slice") for n in names)]
    if len(found) != 1:
        raise UsageError(f"pod {pod_uid}: {len(found)} cgroup directories found under {base} (need exactly one); fix: "
                         "check --cgroup-root points at the node's cgroupfs")
    return found[0]


class CgroupFiles:
    """Reads of a cgroup directory's files through descriptors kept open: ``pread`` at offset 0 makes the
    kernel render the file afresh, and costs about a tenth of open + read + close (a sample reads four)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def read(self, name: str) -> str:
        """The file's text. Raises `OSError` (after one retry with a fresh descriptor) when it cannot be read."""
        with self._lock:
            for attempt in (0, 1):
                fd = self._fds.get(name)
                try:
                    if fd is None:
                        fd = self._fds[name] = os.open(self.path / name, os.O_RDONLY | os.O_CLOEXEC)
                    return os.pread(fd, 1 << 16, 0).decode("ascii", "replace")
                except OSError:
                    self._drop(name)
                    if attempt:
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    def exists(self, name: str) -> bool:
        return name in self._fds or (self.path / name).exists()

    def _drop(self, name: str) -> None:
        fd = self._fds.pop(name, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            for name in list(self._fds):
                self._drop(name)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
