"""TLS and basic auth on every kv-guardian HTTP endpoint (exporter-toolkit web config), over real TLS on
loopback with a self-signed certificate made in the test: 200 with the right credentials, 401 without them
or with a wrong password, and no plain HTTP on a TLS port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from kvg_tenancy import KEYS, USERS, assert_guarded, client_ctx, get, mini_server, web_config_file
from kvg_testing import ROOT, free_port
from kvguardian.core.exporters.webconfig import load_web_config


def test_in_process_exporter_over_tls_with_basic_auth(tmp_path):
    from kvguardian import Guard
    from kvguardian.core.exporters.server import start_exporter

    cfg = load_web_config(web_config_file(tmp_path, USERS))
    with start_exporter(Guard(), port=0, web_config=cfg, check_interval=None) as exp:
        assert exp.url.startswith("https://127.0.0.1:")
        body = assert_guarded("127.0.0.1", exp.port, "/metrics", client_ctx(tmp_path))
        assert b"kvguardian_findings" in body
        # a client that stalls its TLS handshake does not block other scrapes
        with socket.create_connection(("127.0.0.1", exp.port)):
            t0 = time.monotonic()
            assert get("127.0.0.1", exp.port, "/metrics", client_ctx(tmp_path), auth=("ops", "other"))[0] == 200
            assert time.monotonic() - t0 < 5


def test_exporter_command_with_web_config(tmp_path):
    web = web_config_file(tmp_path, USERS)
    report = tmp_path / "r.json"
    from kvguardian.core.findings import Report

    report.write_text(Report(findings=[]).to_json())
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvguardian", "exporter", "--port", str(port), "--report",
                             str(report), "--web-config", str(web), "--duration", "60"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"https://127.0.0.1:{port}/metrics" in line, line
        assert b"kvguardian_findings" in assert_guarded("127.0.0.1", port, "/metrics", client_ctx(tmp_path))
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_watch_exporter_serves_through_the_same_web_config(tmp_path):
    from kvguardian.apps.cli.watch import _serve
    from kvguardian.runtime.engines.watch import Watch

    cfg = load_web_config(web_config_file(tmp_path, USERS))
    watch = Watch("vllm", "http://127.0.0.1:1/metrics", interval=1, grace=1, timeout=1)
    exp = _serve(watch, "127.0.0.1", 0, cfg)
    try:
        assert_guarded("127.0.0.1", exp.port, "/metrics", client_ctx(tmp_path))
    finally:
        exp.close()


def test_mini_server_tls_basic_auth_on_metrics_and_api_keys_on_v1(tmp_path, kv_cli):
    from kvguardian.apps.mini_server.app import MiniConfig, create_app
    from kvguardian.core.exporters.webconfig import serve_asgi

    web = load_web_config(web_config_file(tmp_path, USERS))
    app = create_app(MiniConfig(api_keys=(f"acme={KEYS['acme']}",)), web=web)
    with serve_asgi(app, config=web, lifespan="on") as url:
        assert url.startswith("https://")
        port = int(url.rsplit(":", 1)[1])
        ctx = client_ctx(tmp_path)
        assert b"kvguardian_pool_blocks" in assert_guarded("127.0.0.1", port, "/metrics", ctx)
        assert_guarded("127.0.0.1", port, "/health", ctx)
        body = json.dumps({"model": "kvg-mini", "prompt": "hello", "max_tokens": 2}).encode()
        bearer = {"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": "application/json"}
        status, _, out = get("127.0.0.1", port, "/v1/completions", ctx, headers=bearer, method="POST", body=body)
        assert status == 200 and json.loads(out)["usage"]["completion_tokens"] == 2
        status, _, _ = get("127.0.0.1", port, "/v1/completions", ctx, method="POST", body=body,
                           headers={"Authorization": "Bearer wrong", "Content-Type": "application/json"})
        assert status == 401
        # the audit speaks TLS too (--cacert), and stops at a refused key naming it by position
        rc, _, err = kv_cli("isolation", "cache-sharing", "--url", url, "--model", "kvg-mini", "--key", KEYS["acme"],
                            "--key", "wrong", "--cacert", str(tmp_path / "server.crt"), "--warmup", "1")
        assert rc == 2 and "key #2 was refused" in err, err


def test_serve_mini_command_with_web_config(tmp_path):
    web = web_config_file(tmp_path, USERS)
    with mini_server("--web-config", str(web)) as (url, _):  # no API keys: basic auth guards /v1 too
        port = int(url.rsplit(":", 1)[1])
        assert url.startswith("https://")
        assert b"kvg-mini" in assert_guarded("127.0.0.1", port, "/v1/models", client_ctx(tmp_path))


@pytest.mark.parametrize(("text", "message"), [
    ("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n", "does not exist"),
    ("basic_auth_users: {alice: plaintext}\n", "not a bcrypt hash"),
    ("basic_auth_user: {}\n", "unknown key 'basic_auth_user'"),
    ("tls_server_config: {cert_fle: a}\n", "unknown key tls_server_config.'cert_fle'"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_web_config_is_one_line(tmp_path, kv_cli, text, message):
    path = tmp_path / "web.yml"
    path.write_text(text)
    rc, _, err = kv_cli("exporter", "--once", "--web-config", str(path))
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
