"""Test helpers shared by every test folder. Import them as ``from kvg_testing import ...``
(``tests/`` is on sys.path through pytest's ``pythonpath``); never ``from kvg_testing import``: several
folders have a conftest.py and the name would resolve to whichever was imported first."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import types
from collections.abc import Iterator
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


def docs_reference() -> types.ModuleType:
    """``docs/_hooks/reference.py``, the MkDocs hook that writes the reference pages from the code."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kvg_docs_reference", ROOT / "docs" / "_hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (test traffic stays on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_command(*args: str) -> list[str]:
    """The argv that runs the kv-guardian CLI of this checkout."""
    import sys

    return [sys.executable, "-m", "kvguardian", *args]


def wait_for_line(stream, needle: str, timeout: float = 30.0) -> str:  # type: ignore[no-untyped-def]
    """Read ``stream`` (a text pipe) until a line containing ``needle``; everything read so far is returned.
    Fails the test on EOF or after ``timeout`` seconds (a watchdog thread closes nothing: it only reads)."""
    import threading

    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in stream:
            seen.append(line)
            if needle in line:
                found.set()
                return
        found.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    found.wait(timeout)
    text = "".join(seen)
    if needle not in text:
        pytest.fail(f"no line with {needle!r} within {timeout} s; got {text[-2000:]!r}")
    return text


def rendered(render, data) -> str:  # type: ignore[no-untyped-def]
    """What a reproduction's ``render(data, out)`` prints on a console, as text."""
    import io

    from kvguardian.core.report.console import ConsoleReporter

    buf = io.StringIO()
    render(data, ConsoleReporter(buf))
    return buf.getvalue()


def wait_for_scans(url: str, n: int = 3, timeout: float = 30.0) -> None:
    """Wait until the Redis at ``url`` has served ``n`` more SCAN calls (a sweep is under way), reading
    ``INFO commandstats`` (which neither writes nor touches a key)."""
    import time

    import redis

    client = redis.Redis.from_url(url)
    try:
        def scans() -> int:
            return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))

        start = scans()
        deadline = time.monotonic() + timeout
        while scans() < start + n:
            if time.monotonic() > deadline:
                pytest.fail(f"no sweep started on {url} within {timeout} s")
            time.sleep(0.05)
    finally:
        client.close()


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


@contextlib.contextmanager
def fake_module(name: str) -> Iterator[types.ModuleType]:
    """A module registered in ``sys.modules`` for the block: its globals are roots, as an application's are."""
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    try:
        yield mod
    finally:
        sys.modules.pop(name, None)


@contextlib.contextmanager
def closing_factory(make):  # type: ignore[no-untyped-def]
    """For a factory fixture: ``make(*args, **kw)`` for each call, and every object made is closed when the block
    ends (``with closing_factory(Server) as make: yield make``)."""
    made = []

    def factory(*args, **kw):  # type: ignore[no-untyped-def]
        made.append(make(*args, **kw))
        return made[-1]

    try:
        yield factory
    finally:
        for obj in made:
            obj.close()


def paged_workload(tiny_model, n: int, *, seed: int, sys_tokens: tuple[int, int]):  # type: ignore[no-untyped-def]
    """A mini-engine workload on ``tiny_model``: (`PagedLlama`, requests, HF generate()'s tokens per request id,
    the EOS id). One thread, so the oracle and the engine compute alike."""
    from kvguardian.apps.repro.cross_request import make_workload, one_thread, oracle
    from kvguardian.runtime.paged.model import PagedLlama

    with one_thread():
        reqs, _ = make_workload(n, tiny_model.config.vocab_size, seed=seed, sys_tokens=sys_tokens)
        expected = oracle(tiny_model, reqs)
    return PagedLlama(tiny_model), reqs, expected, tiny_model.generation_config.eos_token_id
