"""The OpenAI-compatible mini server wired to the pre-OOM guard, over real HTTP on loopback: /ready and 503 +
Retry-After while it drains (streamed or not), requests shed mid-way, the pool's prefix cache evicted under its
own pressure, /drain for preStop, and ``kv-guardian serve-mini --oom`` with its bad input."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

from kvg_oom import Knob
from kvg_tenancy import mini_server
from kvguardian.apps.mini_server.app import MiniConfig, create_app
from kvguardian.core.exporters.webconfig import serve_asgi
from kvguardian.ops.oom.guard import OOMGuard

pytest.importorskip("fastapi")

KEY = "sk-a"


def call(port, method, path, body=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def _port(url):
    return int(url.rsplit(":", 1)[1])


def _wait(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _metric(port, name):
    text = call(port, "GET", "/metrics")[2].decode()
    return [ln for ln in text.splitlines() if ln.startswith(name)]


@pytest.fixture
def guarded():
    knob = Knob(used=100)
    oom = OOMGuard([knob], interval=0.02, retry_after=2.5, release=False)
    app = create_app(MiniConfig(api_keys=(f"acme={KEY}",), num_blocks=512, max_model_len=8192), oom=oom)
    with serve_asgi(app, lifespan="on") as url:
        yield app.state.mini, knob, _port(url)


def test_draining_answers_503_with_retry_after_and_ready_follows(guarded):
    mini, knob, port = guarded
    body = {"model": "kvg-mini", "prompt": "hello", "max_tokens": 3}
    assert call(port, "GET", "/ready")[0] == 200
    status, _, out = call(port, "POST", "/v1/completions", body)
    assert status == 200 and json.loads(out)["usage"]["completion_tokens"] == 3
    knob.used = 980  # past the drain watermark (0.97)
    _wait(lambda: call(port, "GET", "/ready")[0] == 503)
    for stream in (False, True):
        status, headers, out = call(port, "POST", "/v1/completions", {**body, "stream": stream})
        err = json.loads(out)["error"]
        assert status == 503 and headers["retry-after"] == "3" and err["type"] == "overloaded", out
    assert call(port, "GET", "/health")[0] == 200  # liveness is not readiness: never 503
    assert _metric(port, "kvguardian_oom_draining ") == ["kvguardian_oom_draining 1.0"]
    assert float(_metric(port, "kvguardian_oom_rejected_admissions_total ")[0].split()[1]) >= 2
    status, _, out = call(port, "GET", "/oom")
    assert status == 200 and json.loads(out)["draining"] is True
    knob.used = 100
    _wait(lambda: call(port, "GET", "/ready")[0] == 200)
    assert call(port, "POST", "/v1/completions", body)[0] == 200
    assert mini.loop.snapshot()["failed"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_shed_while_memory_still_rises_ends_with_overloaded(guarded, stream):
    mini, knob, port = guarded
    body = {"model": "kvg-mini", "prompt": "a long one", "max_tokens": 6000, "stream": stream}
    result = {}
    t = threading.Thread(target=lambda: result.update(r=call(port, "POST", "/v1/completions", body)))
    t.start()
    _wait(lambda: (run := mini.loop.engine.running) and run[0].output)
    knob.used = 995  # past shed (0.99) while draining: the newest request is shed
    t.join(60)
    knob.used = 100
    status, headers, out = result["r"]
    if stream:  # the stream had started: an SSE error event, then [DONE]
        events = [e[6:] for e in out.decode().split("\n\n") if e.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["type"] == "overloaded"
    else:
        assert status == 503 and headers["retry-after"] == "3" and json.loads(out)["error"]["reason"] == "shed"
    assert mini.oom.shed_requests >= 1 and mini.loop.snapshot()["shed"] == 1
    with mini.loop.lock:
        assert mini.pool.metrics()["blocks_referenced"] == 0


def test_the_pools_own_pressure_evicts_its_prefix_cache_over_http():
    oom = OOMGuard([], interval=0.02, release=False)  # the pool is the only signal
    app = create_app(MiniConfig(cache_mode="global", api_keys=(f"acme={KEY}",), num_blocks=64), oom=oom)
    with serve_asgi(app, lifespan="on") as url:
        port = _port(url)
        for i in range(20):  # 20 distinct prompts of 3 full blocks: 60 of 64 blocks cached, past 92 %
            status, _, _ = call(port, "POST", "/v1/completions",
                                {"model": "kvg-mini", "prompt": f"{i:02d}" * 24, "max_tokens": 1})
            assert status == 200
        deadline = time.monotonic() + 10
        while not (evicted := _metric(port, "kvguardian_oom_evictions_total{")) and time.monotonic() < deadline:
            time.sleep(0.05)
        pressure = _metric(port, 'kvguardian_memory_pressure_ratio{signal="pool:mini"}')
    assert evicted and evicted[0].startswith('kvguardian_oom_evictions_total{reason="pool_prefix:mini"}'), evicted
    assert float(evicted[0].split()[1]) >= 1
    assert pressure and float(pressure[0].split()[1]) < 0.92  # evicted below the watermark


def test_drain_for_prestop_waits_for_the_request_in_flight(guarded):
    mini, _, port = guarded
    body = {"model": "kvg-mini", "prompt": "x", "max_tokens": 300}
    result = {}
    t = threading.Thread(target=lambda: result.update(r=call(port, "POST", "/v1/completions", body)))
    t.start()
    _wait(lambda: mini.loop.snapshot()["running"] == 1)
    status, _, out = call(port, "POST", "/drain?deadline=60")
    t.join(60)
    assert status == 200 and json.loads(out)["drained"] is True
    assert result["r"][0] == 200  # the request in flight finished
    assert call(port, "GET", "/ready")[0] == 503  # after preStop: not ready for good
    assert call(port, "POST", "/v1/completions", body)[0] == 503


def test_serve_mini_oom_command_serves_ready_and_the_guards_metrics():
    with mini_server("--oom", "--oom-drain", "0.96", "--kv-budget-mb", "64", "--api-key", f"acme={KEY}") as (url, _):
        port = _port(url)
        assert call(port, "GET", "/ready")[0] == 200
        status, _, out = call(port, "POST", "/v1/completions", {"model": "kvg-mini", "prompt": "hi", "max_tokens": 2})
        assert status == 200
        status, _, out = call(port, "GET", "/oom")
        names = {r["signal"] for r in json.loads(out)["readings"]}
        assert {"pool:mini", "kv_budget"} <= names, names
        assert _metric(port, 'kvguardian_oom_watermark_ratio{action="drain"}') == [
            'kvguardian_oom_watermark_ratio{action="drain"} 0.96']


@pytest.mark.parametrize(("args", "message"), [
    (["--oom-drain", "0.9"], "--oom-drain configures the pre-OOM guard; fix: add --oom"),
    (["--kv-budget-mb", "64"], "--kv-budget-mb configures the pre-OOM guard; fix: add --oom"),
    (["--oom", "--oom-evict", "0.98"], "watermarks out of order"),
    (["--oom", "--kv-budget-mb", "0"], "admits nothing"),
    (["--oom", "--oom-interval", "0"], "must be a positive number of seconds"),
])
def test_serve_mini_oom_bad_input_is_one_line(kv_cli, args, message):
    rc, _, err = kv_cli("serve-mini", "--port", "0", *args, timeout=120)
    assert rc == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
