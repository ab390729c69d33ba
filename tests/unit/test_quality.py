"""ruff and mypy are part of the suite, so CI keeps them clean."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} not installed")
    return found


def test_ruff_clean():
    proc = subprocess.run([_tool("ruff"), "check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_clean():
    proc = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
