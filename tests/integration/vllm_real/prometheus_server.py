"""Start, query and stop a real Prometheus (Debian's ``prometheus`` 2.x) for the fleet test.

The shipped scrape config (deploy/prometheus/prometheus.yml) is copied into a temp dir with only its global
intervals overridden; the shipped rules go next to it as a test copy whose durations are divided by
``SCALE`` (a 10-minute window becomes 10 seconds), and the targets are written as the file_sd files the
config names. Prometheus binds 127.0.0.1 on a free port, keeps its TSDB in the temp dir and is ended by PID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml
from vllm_server import get

from kvg_testing import ROOT, free_port

DEPLOY = ROOT / "deploy" / "prometheus"
SCALE = 60  # durations of the test copy of the rules: minutes become seconds
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATIONS = (re.compile(r"(\[)(\d+)([smhd])(\])"), re.compile(r"(offset\s+)(\d+)([smhd])()"),
              re.compile(r"^(\s*for:\s*)(\d+)([smhd])(\s*)$", re.M))


def scaled(text: str, scale: int = SCALE) -> str:
    """The rule file with every range window, offset and ``for:`` divided by ``scale`` (at least 1 s)."""
    def one(m: re.Match[str]) -> str:
        seconds = max(1, int(m.group(2)) * _UNITS[m.group(3)] // scale)
        return f"{m.group(1)}{seconds}s{m.group(4)}"

    for pattern in _DURATIONS:
        text = pattern.sub(one, text)
    return text


class Prometheus:
    def __init__(self, run_dir: Path, targets: dict[str, list[dict[str, Any]]], interval: str = "1s") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="prometheus-", dir=run_dir))
        (self.dir / "targets").mkdir()
        config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
        config["global"].update(scrape_interval=interval, evaluation_interval=interval)  # the only overrides
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        (self.dir / "kvguardian-rules.yml").write_text(scaled((DEPLOY / "kvguardian-rules.yml").read_text()))
        for job, groups in targets.items():
            (self.dir / "targets" / f"{job}.yml").write_text(yaml.safe_dump(groups))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.dir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, binary: str, timeout: float = 60.0) -> float:
        """Start it; seconds until /-/ready answers (raises RuntimeError with the log if it exits first)."""
        t0 = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.dir)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if get(self.url + "/-/ready", timeout=2)[0] == 200:
                    return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM to the process we started, SIGKILL if it has not ended after 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def api(self, path: str, **params: str) -> Any:
        """``data`` of an HTTP API answer (raises AssertionError with the error Prometheus gave)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        status, body = get(f"{self.url}/api/v1/{path}{query}", timeout=10)
        answer = json.loads(body)
        assert status == 200 and answer.get("status") == "success", (path, params, body[:300])
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])
