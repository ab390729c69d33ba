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


def grow_kv(keys: list, values: list, key_states, value_states, layer_idx: int):  # type: ignore[no-untyped-def]
    """A 4.x-style cache's update: per layer a keys and a values tensor, grown by ``torch.cat`` along the sequence
    dimension. Returns the layer's (keys, values)."""
    import torch

    if layer_idx == len(keys):
        keys.append(key_states)
        values.append(value_states)
    else:
        keys[layer_idx] = torch.cat([keys[layer_idx], key_states], -2)
        values[layer_idx] = torch.cat([values[layer_idx], value_states], -2)
    return keys[layer_idx], values[layer_idx]
