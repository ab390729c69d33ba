"""A real FastAPI + uvicorn server over the paged mini engine in a real child memory cgroup (640 MiB), driven
over loopback HTTP by a load that leaks KV (the handler keeps every request's KV) and by a legitimate
overload (many concurrent requests, each holding 10 MiB while in flight).

With the guard: it evicts at the first watermark, drains at the second, every request either completes with
the tokens Hugging Face generate() gives or gets 503 + Retry-After and succeeds on retry, and the kernel's
OOM counter stays 0. Without it the same server is OOM-killed, under either load. The sidecar watches the
unguarded server by PID and through its metrics: readiness goes false and /drain waits for the running
requests before the kill, and the sidecar exits with a clear line when the server is killed.

The cgroup is created inside this process's own memory cgroup and removed afterwards (tests/kvg_cgroup.py).
"""

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from kvg_cgroup import child_cgroup_or_skip
from kvg_testing import ROOT, free_port

httpx = pytest.importorskip("httpx")

LIMIT = 640 << 20
PROMPTS = [[(x * 7 + i) % 255 + 1 for x in range(1, 400)] for i in range(6)]
LEAK = [(i % 6, 8) for i in range(100)]  # (prompt, new tokens); each keeps ~3.2 MiB of KV after answering
# each holds 10 MiB while in flight, 40 at a time: 400 MiB, more than the ~280 MiB above the server's footprint.
# Steps of 10 MiB (1.6 % of the limit) mean admissions stop between 97.4 % and the 99 % the guard admits up
# to, so the measured pressure crosses the drain watermark (97 %) whenever admission saturates.
OVERLOAD = [(i % 6, 48) for i in range(64)]
WORK_MB = 10
OVERLOAD_WORKERS = 40


@pytest.fixture(scope="module")
def expected():
    """HF generate()'s greedy tokens for every (prompt, new tokens) the loads send."""
    import torch

    from kvguardian.apps.oom_demo_server import SPEC
    from kvguardian.apps.repro.cross_request import one_thread
    from kvguardian.apps.repro.models import build_llama

    model = build_llama(SPEC, seed=0)
    out = {}
    with torch.no_grad(), one_thread():
        for i, new in {*LEAK, *OVERLOAD}:
            ids = torch.tensor([[t % SPEC.vocab for t in PROMPTS[i]]])
            seq = model.generate(ids, max_new_tokens=new, do_sample=False)
            out[(i, new)] = seq[0, ids.shape[1]:].tolist()
    return out


@dataclass
class Outcome:
    ok: int = 0
    rejected: int = 0  # 503 answers (each was retried)
    retried_ok: int = 0  # requests that got at least one 503 and then succeeded
    lost: int = 0  # connection errors: the server is gone
    wrong: list = field(default_factory=list)
    retry_after: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def drive(port, jobs, *, workers, expected, keep=False, work_mb=0, stop=None, outcome=None):
    """Send every job, retrying a 503 after its Retry-After; stops early when ``stop()`` is true."""
    out = outcome or Outcome()
    stopped = threading.Event()

    def go_on():
        if stop is None:
            return True
        if not stopped.is_set() and stop():
            stopped.set()
        return not stopped.is_set()

    def one(job):
        i, new = job
        tries = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
            while go_on():
                try:
                    r = c.post("/generate", json={"prompt": PROMPTS[i], "max_new_tokens": new, "keep": keep,
                                                  "work_mb": work_mb})
                except httpx.TransportError:
                    with out.lock:
                        out.lost += 1
                    return
                if r.status_code == 503:
                    with out.lock:
                        out.rejected += 1
                        out.retry_after.add(r.headers.get("retry-after"))
                    tries += 1
                    time.sleep(float(r.headers["retry-after"]))
                    continue
                assert r.status_code == 200, r.text
                with out.lock:
                    out.ok += 1
                    out.retried_ok += tries > 0
                    if r.json()["tokens"] != expected[job]:
                        out.wrong.append(job)
                return

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, jobs))
    return out


def start_server(cg, tmp_path, *, guarded):
    port = free_port()
    err = open(tmp_path / f"server-{port}.log", "wb")  # noqa: SIM115 - closed by the test's end
    argv = [sys.executable, "-m", "kvguardian.apps.oom_demo_server", "--port", str(port)]
    proc = cg.spawn(argv + ([] if guarded else ["--no-guard"]), stdout=err, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}): {(tmp_path / f'server-{port}.log').read_text()}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            return proc, port
        except httpx.TransportError:
            time.sleep(0.2)
    pytest.fail("the server did not start in 120 s")


def status(port):
    return httpx.get(f"http://127.0.0.1:{port}/oom", timeout=10).json()


def test_guarded_server_evicts_drains_and_loses_no_request(tmp_path, expected):
    cg = child_cgroup_or_skip(LIMIT)
    try:
        proc, port = start_server(cg, tmp_path, guarded=True)
        leak = drive(port, LEAK, workers=8, expected=expected, keep=True)
        st = status(port)
        store = httpx.get(f"http://127.0.0.1:{port}/store", timeout=10).json()
        assert (leak.ok, leak.lost, leak.wrong) == (len(LEAK), 0, [])
        # every request's KV was kept (100 x ~3.2 MiB: more than the headroom above the server's ~360 MiB);
        # the guard evicted the oldest
        assert store["sessions"] + store["evicted"] == len(LEAK) and store["evicted"] > 0
        first = st["first_actions"]
        assert 0.92 <= first["evict"]["pressure"] < 0.97 and first["evict"]["reason"].startswith("retained:")
        assert st["evictions"]["retained:conversation KV kept after the response"] > 0

        over = drive(port, OVERLOAD, workers=OVERLOAD_WORKERS, expected=expected, work_mb=WORK_MB)
        st = status(port)
        assert (over.ok, over.lost, over.wrong) == (len(OVERLOAD), 0, [])  # every one completed, right tokens
        assert over.rejected > 0 and over.retried_ok > 0 and over.retry_after == {"1"}
        first = st["first_actions"]
        assert first["drain_start"]["pressure"] >= 0.97 and "drain_end" in first
        assert first["evict"]["ts"] < first["drain_start"]["ts"]
        assert cg.oom_kills() == 0 and proc.poll() is None
        peak = cg.peak()
        print(f"\nguarded: peak usage {peak >> 20} MiB / {LIMIT >> 20} MiB (cgroup max_usage, page cache "
              f"included), peak working-set pressure {st['peak_pressure']:.3f}; evictions {st['evictions']}; "
              f"leak {leak.ok} ok; overload {over.ok} ok, {over.rejected} answers 503 + Retry-After, "
              f"{over.retried_ok} requests succeeded on retry, {over.lost} lost; actions {st['action_counts']}; "
              f"kernel OOM kills {cg.oom_kills()}")
    finally:
        cg.close()


def test_unguarded_server_is_oom_killed_by_the_overload(tmp_path, expected):
    cg = child_cgroup_or_skip(LIMIT)
    try:
        proc, port = start_server(cg, tmp_path, guarded=False)
        over = drive(port, OVERLOAD, workers=OVERLOAD_WORKERS, expected=expected, work_mb=WORK_MB)
        proc.wait(timeout=30)
        assert over.lost > 0 and proc.returncode == -9 and cg.oom_kills() >= 1
        print(f"\nunguarded overload: {over.ok} ok, {over.lost} lost, server exit {proc.returncode}, kernel OOM "
              f"kills {cg.oom_kills()}")
    finally:
        cg.close()


def active(port):
    """kvguardian_requests_active on the server's metrics page."""
    from kvguardian.runtime.engines.promtext import parse

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(x.value for x in parse(text).get("kvguardian_requests_active", []))


def sidecar_ready(port):
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return None


def test_sidecar_drains_an_unguarded_server_that_is_then_oom_killed(tmp_path, expected):
    cg = child_cgroup_or_skip(LIMIT)
    sidecar = None
    try:
        proc, port = start_server(cg, tmp_path, guarded=False)
        guard_port = free_port()
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "kvguardian", "oom-guard", "--pid", str(proc.pid), "--metrics",
             f"http://127.0.0.1:{port}/metrics", "--port", str(guard_port), "--interval", "0.05",
             "--evict", "0.70", "--drain", "0.75", "--shed", "0.99", "--drain-deadline", "60"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 60
        while sidecar_ready(guard_port) is not True:
            assert sidecar.poll() is None and time.monotonic() < deadline, sidecar.stderr.read()
            time.sleep(0.2)
        # the leak, until the sidecar's readiness goes false (the pod would leave the Service here)
        t_start = time.monotonic()
        leak = drive(port, LEAK * 3, workers=8, expected=expected, keep=True,
                     stop=lambda: sidecar_ready(guard_port) is False)
        side = httpx.get(f"http://127.0.0.1:{guard_port}/status", timeout=5).json()
        assert not side["ready"] and side["pressure"] >= 0.75 and proc.poll() is None and leak.lost == 0
        metrics = httpx.get(f"http://127.0.0.1:{guard_port}/metrics", timeout=5).text
        assert "kvguardian_oom_ready 0.0" in metrics and 'kvguardian_memory_pressure_ratio{signal="cgroup"}' in metrics

        # preStop: /drain answers once the server runs nothing (two slow requests are in flight)
        slow = Outcome()
        t = threading.Thread(target=drive, args=(port, [(0, 96), (1, 96)]),
                             kwargs={"workers": 2, "expected": {(0, 96): None, (1, 96): None}, "outcome": slow})
        t.start()
        while active(port) < 2:
            time.sleep(0.02)
        t_leak = time.monotonic() - t_start
        t0 = time.monotonic()
        drained = httpx.post(f"http://127.0.0.1:{guard_port}/drain?deadline=60", timeout=90).json()
        t.join()
        assert drained["drained"] and drained["waited_s"] > 0 and slow.ok == 2 and time.monotonic() - t0 < 60

        # the load goes on (nothing removes this server from a Service here), and a burst on top: the kernel kills it
        t_kill = time.monotonic()
        drive(port, OVERLOAD, workers=OVERLOAD_WORKERS, expected=expected, work_mb=WORK_MB)
        t_kill = time.monotonic() - t_kill
        proc.wait(timeout=30)
        assert proc.returncode == -9 and cg.oom_kills() >= 1
        _, err = sidecar.communicate(timeout=30)
        assert sidecar.returncode == 3
        assert f"target process {proc.pid} exited (the kernel counted {cg.oom_kills()} OOM kill(s)" in err
        print(f"\nsidecar: not ready at pressure {side['pressure']:.3f} after {leak.ok} leaking requests; /drain "
              f"waited {drained['waited_s']} s for 2 running requests; then the unguarded server was OOM-killed "
              f"(exit {proc.returncode}, kernel OOM kills {cg.oom_kills()}); sidecar said: "
              f"{err.strip().splitlines()[-1]} [leak {t_leak:.1f} s, kill {t_kill:.1f} s]")
    finally:
        if sidecar is not None and sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait(10)
        cg.close()

