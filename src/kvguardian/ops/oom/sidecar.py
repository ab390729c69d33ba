"""``kv-guardian oom-guard``: the pre-OOM guard for a server we cannot hook (vLLM, SGLang, any process).

It watches the target's memory cgroup (by PID, directory or pod UID), optionally its GPUs and metrics page,
and serves ``/ready`` (the readiness probe), ``/drain`` (preStop: waits until the server runs no request),
``/metrics`` and ``/status`` on `kvguardian.core.exporters.http.MetricsHTTPServer`. It cannot evict inside vLLM or
SGLang nor reject a request: it stops admission and drains before the OOM killer would act. Endpoints and
limits: docs/design/oom.md.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvguardian.core.exporters.http import HTTPRequest, MetricsHTTPServer, Response
from kvguardian.ops.oom.guard import OOMGuard

if TYPE_CHECKING:
    from kvguardian.core.exporters.webconfig import WebConfig

__all__ = ["RUNNING_METRICS", "Sidecar", "Target", "process_alive", "running_requests"]

log = logging.getLogger("kvguardian.oom")

#: sample names that count the target's running requests, first present wins
RUNNING_METRICS = ("vllm:num_requests_running", "sglang:num_running_reqs", "kvguardian_oom_in_flight_requests",
                   "kvguardian_requests_active")


def running_requests(metrics_url: str, timeout: float = 2.0) -> float | None:
    """Running requests the target reports, 0.0 when it cannot be reached (nothing runs there), None when
    it answers without any of `RUNNING_METRICS` or with something that is not a metrics page."""
    from kvguardian.runtime.engines.promtext import ScrapeError, fetch, parse

    try:
        scrape = parse(fetch(metrics_url, timeout=timeout))
    except ScrapeError as exc:
        return 0.0 if exc.reason == "connect" else None
    samples = scrape.first(*RUNNING_METRICS)
    return sum(s.value for s in samples) if samples else None


@dataclass(frozen=True)
class Target:
    """The server the sidecar guards: its process, its cgroup directory, its metrics page (each optional)."""

    pid: int | None = None
    cgroup: Path | None = None
    metrics_url: str | None = None

    def gone(self) -> str | None:
        """Why the target is gone (a line), or None while it is there."""
        if self.pid is not None and not process_alive(self.pid):
            return f"target process {self.pid} exited"
        if self.cgroup is not None and not self.cgroup.is_dir():
            return f"target cgroup {self.cgroup} was removed"
        return None


class Sidecar:
    """The guard, a target to watch, and the HTTP endpoints."""

    def __init__(self, oom: OOMGuard, target: Target | None = None, *, drain_deadline: float = 60.0,
                 settle: float = 5.0) -> None:
        self.oom = oom
        self.target = target or Target()
        self.drain_deadline = drain_deadline
        self.settle = settle
        self.server: MetricsHTTPServer | None = None

    def oom_kills(self) -> int:
        return int(sum(r.extra.get("oom_kill", 0) for r in self.oom.readings))

    def _idle(self) -> Callable[[], bool]:
        url = self.target.metrics_url
        if url is not None:
            return lambda: running_requests(url) == 0
        t0 = time.monotonic()
        return lambda: time.monotonic() - t0 >= self.settle

    def drain(self, deadline: float | None = None) -> dict[str, Any]:
        out = self.oom.drain(self.drain_deadline if deadline is None else deadline, idle=self._idle(), poll=0.2)
        if self.target.metrics_url is None:
            out["note"] = f"no --metrics: waited {self.settle:g}s for the endpoint removal, could not see the server"
        return out

    # ------------------------------------------------------------------ HTTP
    def serve(self, host: str, port: int, *, web: WebConfig | None = None) -> tuple[str, int]:
        """Start the HTTP server (its own thread), with ``web``'s TLS and basic auth (a
        `kvguardian.core.exporters.webconfig.WebConfig`); returns the bound (host, port).

        Raises:
            OSError: the address cannot be bound. UsageError: the certificate cannot be loaded.
        """
        from prometheus_client import CollectorRegistry

        from kvguardian.ops.oom.metrics import OOMCollector

        registry = CollectorRegistry()
        registry.register(OOMCollector(self.oom))
        server = MetricsHTTPServer(registry, host, port, web=web)
        server.title = "kv-guardian oom-guard"
        server.route("/ready", self._ready, doc="readiness: 503 while draining")
        server.route("/drain", self._drain, methods=("GET", "POST"), slow=True,
                     doc="preStop: stop admitting, wait for 0 running requests (?deadline=S)")
        server.route("/status", self._status, doc="the guard's state as JSON")
        self.server = server
        return str(server.server_address[0]), int(server.server_address[1])

    @property
    def scheme(self) -> str:
        return self.server.scheme if self.server is not None else "http"

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def _ready(self, _request: HTTPRequest) -> Response:
        oom = self.oom
        return Response.json(200 if oom.ready else 503, {"ready": oom.ready, "pressure": oom.pressure,
                                                          "worst_signal": oom.worst.signal if oom.worst else None})

    def _status(self, _request: HTTPRequest) -> Response:
        return Response.json(200, {**self.oom.status(), "target_pid": self.target.pid,
                                   "metrics_url": self.target.metrics_url})

    def _drain(self, request: HTTPRequest) -> Response:
        deadline = None
        if "deadline" in request.query:
            try:
                deadline = float(request.query["deadline"][0])
            except ValueError:
                deadline = -1.0
            if not 0 <= deadline < math.inf:
                return Response.json(400, {"error": "deadline must be a number of seconds, e.g. /drain?deadline=60"})
        out = self.drain(deadline)
        return Response.json(200 if out["drained"] else 504, out)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited and not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")
