"""Fixtures: real redis-server processes (see kvg_redis.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvg_redis import RedisProc, seed, touch_hot


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[RedisProc]:
    proc = RedisProc(tmp_path / "redis")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProc]:
    """A server holding `SEED` (known patterns and leaks), aged so that untouched keys are cold at 2 s."""
    proc = RedisProc(tmp_path_factory.mktemp("seeded"))
    seed(proc.client())
    time.sleep(3.2)  # idle times count in whole seconds: untouched keys are now ≥ 3 s idle, read ones ≤ 1 s
    touch_hot(proc.client())
    yield proc
    proc.stop()
