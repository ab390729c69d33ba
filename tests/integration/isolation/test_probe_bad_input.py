"""Bad targets for the probe: one clear line and an exit code each, never a traceback, never a hang, and a
429 is backed off, not hammered. The targets are small real HTTP servers on loopback."""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvg_testing import ROOT
from kvguardian.isolation.cache_sharing import CacheSharingProbe, ProbeOptions
from kvguardian.isolation.client import Endpoint

Handler = Callable[[BaseHTTPRequestHandler, dict], None]
MODELS = {"object": "list", "data": [{"id": "m", "object": "model"}]}


@contextlib.contextmanager
def fake_server(completion: Handler, models: object = MODELS, models_status: int = 200) -> Iterator[tuple[str, list]]:
    seen: list[str] = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def _json(self, status, obj, extra=()):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            seen.append(self.path)
            if self.path == "/v1/models":
                self._json(models_status, models)
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self):
            seen.append(self.path)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.json = self._json
            completion(self, body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def sse(h: BaseHTTPRequestHandler, delay: float = 0.0) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    time.sleep(delay)
    for data in (json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}), "[DONE]"):
        chunk = f"data: {data}\n\n".encode()
        h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    h.wfile.write(b"0\r\n\r\n")


def plain(h, body):
    if body.get("stream"):
        sse(h)
    else:
        h.json(200, {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 100}})


def probe(kv_cli, url, *extra):
    return kv_cli("isolation", "cache-sharing", "--url", url, "--model", "m", "--key", "sk-a", "--key", "sk-b",
                  "--max-rps", "200", "--warmup", "1", *extra, timeout=120)


def one_line(err: str) -> str:
    """The one error line (progress lines, indented, may come before it)."""
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("  ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_not_openai_compatible(kv_cli):
    with fake_server(plain, models_status=404) as (url, _):
        rc, _out, err = probe(kv_cli, url)
    assert rc == 2 and "not an OpenAI-compatible API" in one_line(err)


def test_models_not_json_list(kv_cli):
    with fake_server(plain, models={"hello": "world"}) as (url, _):
        rc, _, err = probe(kv_cli, url)
    assert rc == 2 and "no 'data' list" in one_line(err)


def test_unknown_model_names_the_served_ones_escaped(kv_cli):
    listing = {"data": [{"id": "real\x1b[2Jmodel"}]}
    with fake_server(plain, models=listing) as (url, _):
        rc, _, err = probe(kv_cli, url)
    line = one_line(err)
    assert rc == 2 and "is not served" in line and "\x1b" not in line and "\\x1b" in line


def test_server_that_does_not_stream(kv_cli):
    def no_stream(h, body):
        h.json(200, {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 100}})

    with fake_server(no_stream) as (url, _):
        rc, _, err = probe(kv_cli, url)
    assert rc == 2 and "does not stream" in one_line(err)


def test_refused_key_is_named_by_position_never_printed(kv_cli):
    def refuse_b(h, body):
        if h.headers["Authorization"] == "Bearer sk-b":
            h.json(401, {"error": {"message": "bad key sk-b"}})
        else:
            plain(h, body)

    with fake_server(refuse_b) as (url, _):
        rc, out, err = probe(kv_cli, url)
    line = one_line(err)
    assert rc == 2 and "key #2 was refused" in line and "(401)" in line
    assert "sk-b" not in out + err


def test_429_backs_off_and_gives_up_without_hammering():
    calls: list[float] = []

    def throttle(h, body):
        calls.append(time.monotonic())
        h.json(429, {"error": {"message": "slow down"}}, extra=[("Retry-After", "0.2")])

    with fake_server(throttle) as (url, _):
        ep = Endpoint(url, max_rps=1000, max_retries=3)
        result = CacheSharingProbe(ProbeOptions(url=url, model="m", keys=["a", "b"]), endpoint=ep).run()
    assert result.error is not None and "kept answering 429" in result.error and result.error_code == 3
    assert len(calls) == 4  # one try + 3 retries, then stop
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert min(gaps) >= 0.19  # Retry-After honoured between every try


def test_too_noisy_server_is_undecided_with_numbers(kv_cli):
    rng = random.Random(7)

    def noisy(h, body):  # no cache at all, and a first token delayed by heavy-tailed noise
        if body.get("stream"):
            sse(h, delay=rng.choice([0.001, 0.004, 0.012, 0.03]))
        else:
            plain(h, body)

    with fake_server(noisy) as (url, _):
        rc, out, err = probe(kv_cli, url, "--max-samples", "6", "--json")
    data = json.loads(out)
    assert rc == 4, err
    assert data["shared_across_tenants"] is None
    level = data["levels"]["shared_across_tenants"]
    assert level["decision"] == "undecided" and level["samples"] == 6 and 0 < level["p_value"] <= 1


def test_unreachable(kv_cli):
    from kvg_testing import free_port

    rc, _, err = probe(kv_cli, f"http://127.0.0.1:{free_port()}")
    assert rc == 3 and "cannot talk to" in one_line(err)


def test_bad_arguments(kv_cli):
    rc, _, err = kv_cli("isolation", "cache-sharing", "--url", "ftp://x", "--model", "m", "--key", "a", "--key", "b")
    assert rc == 2 and "not an http(s) URL" in one_line(err)
    rc, _, err = kv_cli("isolation", "cache-sharing", "--url", "http://127.0.0.1:1", "--model", "m", "--key", "a")
    assert rc == 2 and "exactly two --key" in one_line(err)
    rc, _, err = kv_cli("isolation", "cache-sharing", "--url", "http://127.0.0.1:1", "--model", "m", "--key", "a",
                        "--key", "b", "--alpha", "2")
    assert rc == 2 and "--alpha" in one_line(err)


@pytest.mark.parametrize("bad", ["http://user:secret@127.0.0.1:1/v1?k=secret"])
def test_credentials_in_url_are_not_printed(kv_cli, bad):
    rc, out, err = probe(kv_cli, bad)
    assert rc == 3 and "secret" not in out + err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_the_probe_with_partial_results(sig):
    def slow(h, body):  # every first token after 50 ms: the probe is still running when the signal comes
        if body.get("stream"):
            sse(h, delay=0.05)
        else:
            plain(h, body)

    with fake_server(slow) as (url, seen):
        proc = subprocess.Popen([sys.executable, "-m", "kvguardian", "isolation", "cache-sharing", "--url", url,
                                 "--model", "m", "--key", "a", "--key", "b", "--warmup", "0", "--max-rps", "100",
                                 "--json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while len(seen) < 4 and time.monotonic() < deadline:  # the probe is measuring
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 5
    assert proc.returncode == 130 and "interrupted" in err, err
    data = json.loads(out)
    assert data["interrupted"] is True and data["requests"] > 0
