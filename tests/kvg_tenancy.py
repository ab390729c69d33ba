"""Test helpers for tenant isolation: the mini OpenAI server as a real subprocess, a self-signed
certificate made in the test (``cryptography``), bcrypt-hashed users, a web-config file."""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.client
import ipaddress
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvg_testing import ROOT

KEYS = {"acme": "sk-acme-0001", "globex": "sk-globex-0002", "acme2": "sk-acme-0003"}
KEY_ARGS = ["--api-key", f"acme={KEYS['acme']}", "--api-key", f"globex={KEYS['globex']}",
            "--api-key", f"acme={KEYS['acme2']}"]


@contextlib.contextmanager
def mini_server(*args: str, timeout: float = 120.0, env: dict[str, str] | None = None,
                scheme: str = "http") -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``kv-guardian serve-mini --port 0 ARGS`` in a subprocess; yields (base URL, process); stops it by PID."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvguardian", "serve-mini", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **(env or {})},
    )
    url = None
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"serving (https?://127\.0\.0\.1:\d+)/v1", line)
        if m:
            url = m.group(1)
            break
    if url is None:
        proc.kill()
        raise RuntimeError(f"serve-mini did not start: {''.join(lines)[-2000:]}")
    try:
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_http(url: str, timeout: float = 30.0, context: object = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2, context=context)  # type: ignore[arg-type]
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (and its key), made here, valid one day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kv-guardian test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "server.crt", tmp / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def web_config_file(tmp: Path, users: dict[str, str], *, tls: bool = True) -> Path:
    """A web-config YAML with relative cert paths and ``users`` (name -> password) hashed with bcrypt."""
    import bcrypt

    lines = []
    if tls:
        self_signed(tmp)
        lines += ["tls_server_config:", "  cert_file: server.crt", "  key_file: server.key"]
    if users:
        lines.append("basic_auth_users:")
        for user, password in users.items():
            hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
            lines.append(f"  {user}: '{hashed.replace('$2b$', '$2y$')}'")
    path = tmp / "web.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


USERS = {"prometheus": "s3cret-pass", "ops": "other"}


def client_ctx(tmp: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tmp / "server.crt"))


def get(host: str, port: int, path: str, ctx: ssl.SSLContext | None, auth: tuple[str, str] | None = None,
        headers: dict[str, str] | None = None, method: str = "GET", body: bytes | None = None):
    conn = (http.client.HTTPSConnection(host, port, context=ctx, timeout=20) if ctx
            else http.client.HTTPConnection(host, port, timeout=20))
    h = dict(headers or {})
    if auth:
        h["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def assert_guarded(host, port, path, ctx):
    status, hdrs, body = get(host, port, path, ctx, auth=("prometheus", USERS["prometheus"]))
    assert status == 200, body[:300]
    assert get(host, port, path, ctx)[0] == 401
    status, hdrs, _ = get(host, port, path, ctx, auth=("prometheus", "wrong"))
    assert status == 401 and "Basic" in hdrs.get("WWW-Authenticate", hdrs.get("www-authenticate", ""))
    assert get(host, port, path, ctx, auth=("nobody", USERS["prometheus"]))[0] == 401
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException, OSError)):
        get(host, port, path, None)  # plain HTTP on the TLS port gets no answer
    return body
