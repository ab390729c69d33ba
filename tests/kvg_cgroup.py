"""A child memory cgroup for tests: created inside this process's own cgroup, removed afterwards.

Only ever below the memory cgroup that ``/proc/self/cgroup`` names (never elsewhere): the test machine has
cgroup v1 memory mounted read-write and runs as root. Processes are put into it by a shell that writes its
own PID to ``cgroup.procs`` and then execs the command, so nothing else moves. `close` ends only the
processes it started (by PID) and removes the directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest

from kvg_testing import IN_CI

__all__ = ["ChildCgroup", "child_cgroup_or_skip"]


class ChildCgroup:
    def __init__(self, limit_bytes: int) -> None:
        from kvguardian.ops.oom.signals.cgroupfs import locate

        own = locate("self")
        self.version = own.version
        self.path = own.path / f"kvg-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            if self.version == 1:
                (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            else:
                (self.path / "memory.max").write_text(str(limit_bytes))
                (self.path / "memory.swap.max").write_text("0")
        except OSError:
            self.path.rmdir()
            raise
        self.limit = limit_bytes

    def spawn(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        procs = self.path / "cgroup.procs"
        cmd = ["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *argv]
        p = subprocess.Popen(cmd, **kwargs)  # type: ignore[call-overload]
        self.procs.append(p)
        return p

    def read(self, name: str) -> str:
        return (self.path / name).read_text()

    def oom_kills(self) -> int:
        from kvguardian.ops.oom.signals.cgroup import cgroup_signal

        return int(cgroup_signal(self.path).read().extra.get("oom_kill", 0))

    def peak(self) -> int:
        return int(self.read("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"could not remove test cgroup {self.path}")


def child_cgroup_or_skip(limit_bytes: int) -> ChildCgroup:
    try:
        return ChildCgroup(limit_bytes)
    except (OSError, ValueError) as exc:  # not root, read-only cgroupfs, no memory controller
        msg = f"cannot create a child memory cgroup here ({exc}); the real-cgroup tests need root and cgroupfs"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
        raise
