"""The sidecar's endpoints over real HTTP (a guard on a signal we set, a metrics page we serve), on the bounded
server every kv-guardian endpoint shares (thousands of idle half-requests, TLS and basic auth from
--web-config), and the ``kv-guardian oom-guard`` command's bad input: one line and an exit code each."""

import json
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from kvg_hostile import loris_flood
from kvg_oom import Knob
from kvg_tenancy import USERS, assert_guarded, client_ctx, get, web_config_file
from kvg_testing import cli_command, wait_for_line
from kvguardian.ops.oom.guard import OOMGuard
from kvguardian.ops.oom.sidecar import Sidecar, Target, process_alive, running_requests

pytest.importorskip("prometheus_client")


class FakeEngine:
    """A metrics page with ``vllm:num_requests_running`` (as vLLM writes it) that the test moves."""

    def __init__(self):
        self.running = 2
        engine = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                body = ("# HELP vllm:num_requests_running Requests running\n# TYPE vllm:num_requests_running gauge\n"
                        f'vllm:num_requests_running{{engine="0",model_name="m"}} {engine.running}.0\n').encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine():
    e = FakeEngine()
    yield e
    e.close()


def test_running_requests_reads_vllm_and_treats_a_dead_server_as_idle(engine):
    assert running_requests(engine.url) == 2
    engine.running = 0
    assert running_requests(engine.url) == 0
    assert running_requests("http://127.0.0.1:9/metrics") == 0.0  # connection refused: nothing runs there


def test_ready_drain_status_and_metrics_over_http(engine):
    knob = Knob(used=100)
    side = Sidecar(OOMGuard([knob], interval=0.02), Target(metrics_url=engine.url), drain_deadline=10)
    host, port = side.serve("127.0.0.1", 0)
    base = f"http://{host}:{port}"
    side.oom.start()
    try:
        assert httpx.get(f"{base}/ready").status_code == 200
        knob.used = 980
        deadline = time.monotonic() + 5
        while httpx.get(f"{base}/ready").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = httpx.get(f"{base}/ready")
        assert r.status_code == 503 and r.json()["worst_signal"] == "cgroup"
        assert "kvguardian_oom_draining 1.0" in httpx.get(f"{base}/metrics").text
        knob.used = 100
        threading.Timer(0.4, lambda: setattr(engine, "running", 0)).start()
        t0 = time.monotonic()
        out = httpx.post(f"{base}/drain?deadline=10", timeout=20).json()
        assert out["drained"] and 0.3 < time.monotonic() - t0 < 9
        st = httpx.get(f"{base}/status").json()
        assert st["shutdown"] and not st["ready"] and st["metrics_url"] == engine.url
        assert httpx.get(f"{base}/ready").status_code == 503  # after preStop: not ready for good
        for bad in ("x", "nan", "-1", "inf"):
            assert httpx.get(f"{base}/drain?deadline={bad}").status_code == 400, bad
        assert httpx.get(f"{base}/nope").status_code == 404
        head = httpx.head(f"{base}/ready")
        assert head.status_code == 503 and head.content == b"" and int(head.headers["content-length"]) > 10
        r = httpx.post(f"{base}/ready")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
        assert b"/drain" in httpx.get(f"{base}/").content
    finally:
        side.oom.stop()
        side.close()


def test_a_head_request_never_drains():
    """HEAD is for looking: a crawler or a monitor's HEAD /drain must not take the server out of service."""
    side = Sidecar(OOMGuard([Knob(used=100)]), Target(), settle=0.1)
    host, port = side.serve("127.0.0.1", 0)
    try:
        r = httpx.head(f"http://{host}:{port}/drain")
        assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
        assert side.oom.ready and not side.oom.status()["shutdown"]
        assert httpx.head(f"http://{host}:{port}/status").status_code == 200
    finally:
        side.close()


def test_drain_deadline_is_504_while_the_engine_still_runs(engine):
    side = Sidecar(OOMGuard([Knob(used=100)]), Target(metrics_url=engine.url))
    host, port = side.serve("127.0.0.1", 0)
    try:
        r = httpx.get(f"http://{host}:{port}/drain?deadline=0.3", timeout=10)
        assert r.status_code == 504 and r.json()["drained"] is False
    finally:
        side.close()


def test_a_drain_in_progress_holds_up_neither_probes_nor_scrapes(engine):
    side = Sidecar(OOMGuard([Knob(used=100)]), Target(metrics_url=engine.url))
    host, port = side.serve("127.0.0.1", 0)
    base = f"http://{host}:{port}"
    try:
        with httpx.Client(timeout=20) as c:
            drains = [threading.Thread(target=c.get, args=(f"{base}/drain?deadline=2",)) for _ in range(4)]
            for t in drains:
                t.start()
            time.sleep(0.3)  # the four drains wait for the engine (it keeps 2 requests running)
            t0 = time.monotonic()
            assert c.get(f"{base}/ready").status_code == 503  # shut down by the drains, answered at once
            assert c.get(f"{base}/metrics").status_code == 200
            busy = c.get(f"{base}/drain?deadline=1")  # a fifth slow request beyond the four allowed
            assert time.monotonic() - t0 < 1.5  # a hang bound: nothing waited for the drains
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
            for t in drains:
                t.join(10)
    finally:
        side.close()


def test_thousands_of_idle_half_requests_neither_make_threads_nor_stall_probes(tmp_path):
    """The sidecar was a ThreadingHTTPServer: one thread per connection and no read timeout."""
    d = v1_cgroup(tmp_path, 1 << 30)
    proc = subprocess.Popen(cli_command("oom-guard", "--cgroup", str(d), "--port", "0", "--duration", "120"),
                            stderr=subprocess.PIPE, text=True)
    try:
        port = int(re.search(r"127\.0\.0\.1:(\d+)", wait_for_line(proc.stderr, "/ready")).group(1))
        flood = loris_flood(proc.pid, port, lambda: get("127.0.0.1", port, "/ready", None),
                            first_bytes=b"GET /ready HTTP/1.1\r\n")
    finally:
        proc.terminate()
        proc.wait(10)
    assert flood["connections"] > 2500, "the flood really happened"
    status, _, body = flood["answer"]
    assert status == 200 and json.loads(body)["ready"] is True
    assert flood["threads"] <= flood["baseline"] + 4, flood
    assert flood["seconds"] < 10  # a hang bound, not a speed figure
    assert proc.returncode == 0  # SIGTERM: exit 0 (the documented code)


def test_oom_guard_serves_tls_and_basic_auth_from_web_config(tmp_path):
    d = v1_cgroup(tmp_path, 1 << 30)
    web = web_config_file(tmp_path, USERS)
    proc = subprocess.Popen(cli_command("oom-guard", "--cgroup", str(d), "--port", "0", "--web-config", str(web),
                                        "--duration", "120"), stderr=subprocess.PIPE, text=True)
    try:
        line = wait_for_line(proc.stderr, "/ready")
        port = int(re.search(r"https://127\.0\.0\.1:(\d+)", line).group(1))
        ctx = client_ctx(tmp_path)
        for path in ("/ready", "/status", "/metrics"):
            assert_guarded("127.0.0.1", port, path, ctx)
        assert get("127.0.0.1", port, "/drain?deadline=0", ctx)[0] == 401  # preStop needs the credentials too
    finally:
        proc.terminate()
        proc.wait(10)


def test_without_metrics_drain_waits_the_settle_time_and_says_so():
    side = Sidecar(OOMGuard([Knob(used=100)]), settle=0.2)
    out = side.drain(5)
    assert out["drained"] and out["waited_s"] >= 0.2 and "could not see the server" in out["note"]


def test_process_alive():
    import os
    import subprocess
    import sys

    assert process_alive(os.getpid())
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while process_alive(p.pid) and time.monotonic() < deadline:  # a zombie counts as gone
        time.sleep(0.01)
    assert not process_alive(p.pid)
    p.wait()


def v1_cgroup(tmp_path, limit, name="grp"):
    d = tmp_path / name
    d.mkdir()
    (d / "memory.usage_in_bytes").write_text(str(300 << 20))
    (d / "memory.limit_in_bytes").write_text(str(limit))
    (d / "memory.stat").write_text("total_inactive_file 0\n")
    return d


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--pid", "999999999"], 2, "does not exist; fix: pass the PID"),
    (["--pid", "-4"], 2, "not a process id"),
    (["--cgroup", "/nonexistent-kvg"], 2, "does not exist; fix: pass a cgroup directory"),
    (["--cgroup", "{unlimited}"], 2, "has no memory limit set"),
    (["--cgroup", "{limited}", "--evict", "0.98", "--drain", "0.97"], 2, "watermarks out of order"),
    (["--cgroup", "{limited}", "--metrics", "ftp://x"], 2, "not an http(s) URL"),
    (["--cgroup", "{limited}", "--nvml-index", "0"], 3, "NVML"),
    (["--pod-uid", "../etc", "--cgroup-root", "{tmp}"], 2, "not a pod UID"),
    (["--cgroup", "{limited}", "--port", "70000"], 2, "--port 70000 is not a TCP port"),
    (["--cgroup", "{limited}", "--host", "203.0.113.7"], 3, "fix: bind an address of this machine"),
    (["--cgroup", "{limited}", "--web-config", "{tmp}/nope.yml"], 2, "--web-config"),
    # accepted before: a negative limit judged every reading against it, a nan deadline never passes
    (["--cgroup", "{unlimited}", "--memory-limit-mb", "-5"], 2, "--memory-limit-mb -5 must be > 0"),
    (["--cgroup", "{limited}", "--memory-limit-mb", "0"], 2, "--memory-limit-mb 0 must be > 0"),
    (["--cgroup", "{limited}", "--drain-deadline", "nan"], 2, "--drain-deadline nan must be a number of seconds"),
    (["--cgroup", "{limited}", "--settle", "-5"], 2, "--settle -5 must be a number of seconds"),
])
def test_oom_guard_bad_input_is_one_line_and_an_exit_code(kv_cli, tmp_path, args, code, message):
    if "--nvml-index" in args:
        pynvml = pytest.importorskip("pynvml")
        try:
            pynvml.nvmlInit()
            pytest.skip("NVML works here")
        except Exception:
            pass
    limited = v1_cgroup(tmp_path, 1 << 30)
    unlimited = v1_cgroup(tmp_path, 9223372036854771712, name="unlimited")
    args = [a.format(limited=limited, unlimited=unlimited, tmp=tmp_path) for a in args]
    rc, _, err = kv_cli("oom-guard", *args, timeout=60)
    assert rc == code and message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_oom_guard_once_prints_the_status(kv_cli, tmp_path):
    d = v1_cgroup(tmp_path, 1 << 30)
    rc, out, err = kv_cli("oom-guard", "--cgroup", str(d), "--once", timeout=60)
    assert rc == 0, err
    st = json.loads(out)
    (r,) = st["readings"]
    assert r["used"] == 300 << 20 and r["limit"] == 1 << 30 and st["ready"]
    unlimited = v1_cgroup(tmp_path, 1 << 62, name="unlimited")
    rc, out, _ = kv_cli("oom-guard", "--cgroup", str(unlimited), "--memory-limit-mb", "400", "--once", timeout=60)
    assert rc == 0 and json.loads(out)["readings"][0]["limit"] == 400 << 20
