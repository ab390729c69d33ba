"""``kv-guardian oom-guard``: the pre-OOM guard for a server we cannot hook (vLLM, SGLang, any process).

It watches the target's memory cgroup (by PID, by cgroup directory, or by Kubernetes pod UID) and,
optionally, its GPUs (NVML) and its metrics page, and serves:

- ``GET /ready``: 200, or 503 once the pressure crosses the drain watermark (until it falls below the
  release point) or after ``/drain``: the readiness probe, so Kubernetes stops sending new requests;
- ``GET|POST /drain?deadline=S``: preStop. Readiness goes false for good; the answer comes when the server
  reports no running request (``vllm:num_requests_running``, ``sglang:num_running_reqs``, or kv-guardian's
  own ``kvguardian_oom_in_flight_requests`` / ``kvguardian_requests_active``) or after ``S`` seconds: 200
  ``{"drained": true}``, 504 at the deadline. Without ``--metrics`` it waits ``--settle`` seconds (time for
  the endpoint removal to reach the load balancers) and says it could not see the server;
- ``GET /metrics``: the guard's Prometheus metrics; ``GET /status``: its state as JSON.

What it cannot do, plainly: it cannot evict anything inside vLLM or SGLang (their KV lives in their own
preallocated pool, and their prefix caches are theirs), nor reject a request itself (it is not in the
request path). It prevents admission (readiness) and drains before the kernel's OOM killer would act.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kvguardian.oom.guard import OOMGuard

__all__ = ["RUNNING_METRICS", "Sidecar", "process_alive", "running_requests"]

log = logging.getLogger("kvguardian.oom")

#: sample names that count the target's running requests, first present wins
RUNNING_METRICS = ("vllm:num_requests_running", "sglang:num_running_reqs", "kvguardian_oom_in_flight_requests",
                   "kvguardian_requests_active")


def running_requests(metrics_url: str, timeout: float = 2.0) -> float | None:
    """Running requests the target reports, 0.0 when it cannot be reached (nothing runs there), None when
    it answers without any of `RUNNING_METRICS` or with something that is not a metrics page."""
    from kvguardian.engines.promtext import ScrapeError, fetch, parse

    try:
        scrape = parse(fetch(metrics_url, timeout=timeout))
    except ScrapeError as exc:
        return 0.0 if exc.reason == "connect" else None
    samples = scrape.first(*RUNNING_METRICS)
    return sum(s.value for s in samples) if samples else None


class Sidecar:
    """The guard, a target to watch, and the HTTP endpoints."""

    def __init__(self, oom: OOMGuard, *, pid: int | None = None, cgroup: Path | None = None,
                 metrics_url: str | None = None, drain_deadline: float = 60.0, settle: float = 5.0) -> None:
        self.oom = oom
        self.pid = pid
        self.cgroup = cgroup
        self.metrics_url = metrics_url
        self.drain_deadline = drain_deadline
        self.settle = settle
        self.server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the target
    def target_gone(self) -> str | None:
        """Why the target is gone (a line), or None while it is there."""
        if self.pid is not None and not process_alive(self.pid):
            return f"target process {self.pid} exited"
        if self.cgroup is not None and not self.cgroup.is_dir():
            return f"target cgroup {self.cgroup} was removed"
        return None

    def oom_kills(self) -> int:
        return int(sum(r.extra.get("oom_kill", 0) for r in self.oom.readings))

    def _idle(self) -> Callable[[], bool]:
        if self.metrics_url is not None:
            url = self.metrics_url
            return lambda: running_requests(url) == 0
        t0 = time.monotonic()
        return lambda: time.monotonic() - t0 >= self.settle

    def drain(self, deadline: float | None = None) -> dict[str, Any]:
        out = self.oom.drain(self.drain_deadline if deadline is None else deadline, idle=self._idle(), poll=0.2)
        if self.metrics_url is None:
            out["note"] = f"no --metrics: waited {self.settle:g}s for the endpoint removal, could not see the server"
        return out

    # ------------------------------------------------------------------ HTTP
    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Start the HTTP server in a thread; returns the bound (host, port)."""
        self.server = ThreadingHTTPServer((host, port), _handler(self))
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="kvguardian-sidecar", daemon=True)
        self._thread.start()
        bound = self.server.server_address
        return str(bound[0]), int(bound[1])

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def metrics_text(self) -> tuple[bytes, str]:
        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

        from kvguardian.oom.metrics import OOMCollector

        registry = CollectorRegistry()
        registry.register(OOMCollector(self.oom))
        return generate_latest(registry), CONTENT_TYPE_LATEST


def _handler(sidecar: Sidecar) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kv-guardian-oom-guard"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: probes hit this every few seconds
            return

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode())

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            oom = sidecar.oom
            if url.path == "/ready":
                self._json(200 if oom.ready else 503, {"ready": oom.ready, "pressure": oom.pressure,
                                                        "worst_signal": oom.worst.signal if oom.worst else None})
            elif url.path == "/drain":
                self._drain(url.query)
            elif url.path == "/metrics":
                body, ctype = sidecar.metrics_text()
                self._send(200, body, ctype)
            elif url.path == "/status":
                self._json(200, {**oom.status(), "target_pid": sidecar.pid, "metrics_url": sidecar.metrics_url})
            else:
                self._json(404, {"error": "not found; endpoints: /ready /drain /metrics /status"})

        do_POST = do_GET

        def _drain(self, query: str) -> None:
            q = urllib.parse.parse_qs(query)
            try:
                deadline = float(q["deadline"][0]) if "deadline" in q else None
            except ValueError:
                self._json(400, {"error": "deadline must be a number of seconds, e.g. /drain?deadline=60"})
                return
            out = sidecar.drain(deadline)
            self._json(200 if out["drained"] else 504, out)

    return Handler


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited and not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")
