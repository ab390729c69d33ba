"""Shared fixtures. Real services only: a missing binary skips locally and fails in CI (CI=true)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(name: str) -> str:
    """Path of a system binary the test needs; skip without it locally, fail in CI."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed; run ./scripts/setup.sh --services"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (test traffic stays on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_model():
    """The built-in tiny random-weight Llama (2 layers, hidden 64), shared by a test session."""
    from kvguardian.repro.models import TINY, build_llama

    return build_llama(TINY)


@pytest.fixture
def kv_cli():
    """Run the CLI in a subprocess: returns (exit code, stdout, stderr)."""
    import subprocess

    def run(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        proc = subprocess.run(
            [sys.executable, "-m", "kvguardian", *args],
            capture_output=True, text=True, timeout=timeout, cwd=ROOT,
            env={**os.environ, **(env or {})},
        )
        return proc.returncode, proc.stdout, proc.stderr

    return run
