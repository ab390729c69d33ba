"""Test helpers shared by every test folder. Import them as ``from kvg_testing import ...``
(``tests/`` is on sys.path through pytest's ``pythonpath``); never ``from kvg_testing import``: several
folders have a conftest.py and the name would resolve to whichever was imported first."""

from __future__ import annotations

import os
import shutil
import socket
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
