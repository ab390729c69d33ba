"""rediss:// against a real TLS redis-server (a self-signed certificate made here with openssl)."""

from __future__ import annotations

import subprocess
import time

import pytest
from kvg_redis import free_port, redis, require_binary, seed

from kvguardian.keyspace.scan import ScanOptions, scan

pytestmark = pytest.mark.services


def test_rediss_url_with_a_ca_file(tmp_path):
    openssl = require_binary("openssl")
    server = require_binary("redis-server")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen([server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                             "--tls-auth-clients", "no", "--save", "", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(cert))
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "TLS redis-server did not start"
                time.sleep(0.1)
        seed(client)
        result = scan(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}", ScanOptions())
        assert result.complete and result.mode == "lua" and result.keys_scanned == client.dbsize()
        assert {p["pattern"] for p in result.patterns} >= {"session:{uuid}", "tmp_{ts_ns}"}
    finally:
        proc.kill()
        proc.wait(10)
