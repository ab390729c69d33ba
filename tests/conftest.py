"""Shared fixtures. Real services only: a missing binary skips locally and fails in CI (CI=true)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from kvg_testing import IN_CI, ROOT, free_port, require_binary  # noqa: F401 - re-exported for old imports


def pytest_configure(config):
    # A shell starts background jobs with SIGINT and SIGQUIT ignored, and an ignored signal is inherited through
    # exec: every process a test starts would then ignore Ctrl-C, and the tests that send SIGINT would test the
    # launcher, not kv-guardian (a suite started with `... &` failed all of them). Start from what a terminal
    # gives, as CI runners do.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture(scope="session")
def tiny_model():
    """The built-in tiny random-weight Llama (2 layers, hidden 64), shared by a test session."""
    from kvguardian.apps.repro.models import TINY, build_llama

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
