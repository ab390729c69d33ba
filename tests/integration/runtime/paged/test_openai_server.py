"""The mini OpenAI-compatible server over real HTTP: streaming as OpenAI/vLLM stream it, models, keys as
tenants, cache_salt, errors OpenAI-style, and a client that goes away gives its blocks back."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from kvguardian.apps.mini_server.app import MiniConfig, create_app
from kvguardian.core.exporters.webconfig import serve_asgi

KEYS = ("acme=sk-a", "globex=sk-b")


@pytest.fixture(scope="module")
def server():
    app = create_app(MiniConfig(cache_mode="per-tenant", api_keys=KEYS, debug=True, num_blocks=256))
    with serve_asgi(app, lifespan="on") as url:
        host, port = url.split("//")[1].split(":")
        yield app.state.mini, host, int(port)


def call(server, method, path, body=None, key="sk-a", stream_read=True):
    _, host, port = server
    c = http.client.HTTPConnection(host, port, timeout=30)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    return r, (r.read() if stream_read else c)


def test_models(server):
    r, body = call(server, "GET", "/v1/models")
    data = json.loads(body)
    assert r.status == 200 and data["object"] == "list" and data["data"][0]["id"] == "kvg-mini"
    assert call(server, "GET", "/v1/models", key=None)[0].status == 401


def test_streaming_is_sse_with_done_and_usage(server):
    r, body = call(server, "POST", "/v1/completions", {"model": "kvg-mini", "prompt": "hello world",
                                                       "max_tokens": 5, "stream": True,
                                                       "stream_options": {"include_usage": True}})
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    events = [ln[6:] for ln in body.decode().split("\n\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c for c in chunks if c["choices"]]
    assert len(tokens) == 5 and all(c["object"] == "text_completion" for c in tokens)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 4 + ["length"]
    assert chunks[-1]["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}


def test_greedy_output_is_the_same_streamed_or_not_and_per_token_ids(server):
    body = {"model": "kvg-mini", "prompt": "abc", "max_tokens": 6}
    whole = json.loads(call(server, "POST", "/v1/completions", body)[1])
    ids = json.loads(call(server, "POST", "/v1/completions", {**body, "prompt": [100, 101, 102]})[1])
    assert whole["choices"][0]["text"] == ids["choices"][0]["text"]  # "abc" is bytes 97..99 -> ids 100..102
    streamed = call(server, "POST", "/v1/completions", {**body, "stream": True})[1].decode()
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in streamed.split("\n\n")
                   if e.startswith("data: {"))
    assert text == whole["choices"][0]["text"]


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "other", "prompt": "x"}, 404, "model"),
    ({"model": "kvg-mini", "prompt": ""}, 400, "prompt"),
    ({"model": "kvg-mini", "prompt": {"a": 1}}, 400, "prompt"),
    ({"model": "kvg-mini", "prompt": [99999]}, 400, "prompt"),
    ({"model": "kvg-mini", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "kvg-mini", "prompt": "x" * 5000}, 400, "prompt"),
    ({"model": "kvg-mini", "prompt": "x", "cache_salt": 5}, 400, "cache_salt"),
    ({"model": "kvg-mini", "prompt": "x", "n": 2}, 400, "n"),
])
def test_bad_requests_are_openai_errors(server, body, status, param):
    r, out = call(server, "POST", "/v1/completions", body)
    err = json.loads(out)["error"]
    assert r.status == status and err["param"] == param and err["message"]


def test_unknown_key_is_401_and_never_echoed(server):
    r, out = call(server, "POST", "/v1/completions", {"model": "kvg-mini", "prompt": "x"}, key="sk-secret-guess")
    assert r.status == 401 and b"sk-secret-guess" not in out


def test_cache_salt_partitions_a_tenant(server):
    mini = server[0]
    prompt = "s" * 200
    before = mini.pool.prefix_hits
    call(server, "POST", "/v1/completions", {"model": "kvg-mini", "prompt": prompt, "max_tokens": 1})
    call(server, "POST", "/v1/completions", {"model": "kvg-mini", "prompt": prompt, "max_tokens": 1,
                                             "cache_salt": "SALT-CANARY"})
    assert mini.pool.prefix_hits == before  # another salt of the same tenant: no hit
    call(server, "POST", "/v1/completions", {"model": "kvg-mini", "prompt": prompt, "max_tokens": 1,
                                             "cache_salt": "SALT-CANARY"})
    assert mini.pool.prefix_hits > before
    events = mini.pool.take_events()
    assert events and all("SALT-CANARY" not in repr(e.to_dict()) for e in events)  # salts are hashed


def test_client_disconnect_aborts_and_frees_blocks(server):
    mini, host, port = server
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("POST", "/v1/completions", json.dumps({"model": "kvg-mini", "prompt": "q" * 64, "max_tokens": 4000,
                                                     "stream": True}),
              {"Authorization": "Bearer sk-a", "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.readline().startswith(b"data:")
    c.sock.shutdown(socket.SHUT_RDWR)  # go away mid-stream (the response still holds the fd: shut it down)
    c.close()
    r.close()
    deadline = time.monotonic() + 20
    while mini.loop.snapshot()["aborted"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    snap = mini.loop.snapshot()
    assert snap["aborted"] >= 1 and snap["running"] == 0
    with mini.loop.lock:
        assert mini.pool.metrics()["blocks_referenced"] == 0
        assert mini.pool.check_invariants() == [] and mini.pool.faults == []


def test_metrics_and_health(server):
    _, host, port = server
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    assert 'kvguardian_pool_prefix_hits_total{pool="mini"}' in text and "kvguardian_findings" in text
    c.request("GET", "/health")
    assert json.loads(c.getresponse().read())["status"] == "ok"


def test_a_guard_gets_the_pools_cached_blocks_as_ledger_entries():
    from kvguardian import Guard

    guard = Guard()
    app = create_app(MiniConfig(cache_mode="global", num_blocks=64), guard=guard)
    with serve_asgi(app, lifespan="on") as url:
        host, port = url.split("//")[1].split(":")
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        c.request("POST", "/v1/completions", json.dumps({"model": "kvg-mini", "prompt": "p" * 100, "max_tokens": 1}),
                  {"Content-Type": "application/json"})
        assert c.getresponse().read()
        deadline = time.monotonic() + 10
        while True:  # the feed runs right after the step that answered: poll for it
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
            entries = [ln for ln in text.splitlines() if ln.startswith("kvguardian_kv_entries")]
            n = sum(float(ln.rsplit(" ", 1)[1]) for ln in entries)
            if n >= 6 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert n == 6  # 100 tokens: 6 full blocks of 16, each a ledger entry
    assert guard.check().findings == []  # cached blocks are declared retention, not leaks


def _open_stream(host, port, max_tokens):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("POST", "/v1/completions", json.dumps({"model": "kvg-mini", "prompt": "q" * 64,
                                                     "max_tokens": max_tokens, "stream": True}),
              {"Authorization": "Bearer sk-a", "Content-Type": "application/json"})
    return c


def _go_away(c):
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()


def _until(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_gone_before_its_first_token_is_aborted_while_it_waits():
    """One request runs at a time: the second waits for its first token; its client leaves; it is taken out
    of the queue at once (before, it stayed queued until the request ahead of it ended, 4.7 s here)."""
    app = create_app(MiniConfig(api_keys=KEYS, num_blocks=300, max_num_seqs=1))
    with serve_asgi(app, lifespan="on") as url:
        mini = app.state.mini
        host, port = url.split("//")[1].split(":")
        busy = _open_stream(host, int(port), 4000)
        r = busy.getresponse()
        assert r.readline().startswith(b"data:")
        waiting = _open_stream(host, int(port), 8)
        _until(lambda: mini.loop.snapshot()["waiting"] == 1)
        t0 = time.monotonic()
        _go_away(waiting)
        _until(lambda: mini.loop.snapshot()["aborted"] == 1)
        snap = mini.loop.snapshot()
        assert snap["running"] == 1 and snap["waiting"] == 0, (snap, time.monotonic() - t0)  # the busy one runs on
        _go_away(busy)
        r.close()
        _until(lambda: mini.loop.snapshot()["running"] == 0)  # aborted too (or ended at EOS meanwhile)
        with mini.loop.lock:
            assert mini.pool.metrics()["blocks_referenced"] == 0 and mini.pool.check_invariants() == []
