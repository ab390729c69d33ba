"""TLS and basic auth for every kv-guardian HTTP endpoint, configured like a Prometheus exporter.

``--web-config FILE`` is the exporter-toolkit web configuration (``tls_server_config``, ``basic_auth_users``
with bcrypt hashes), read strictly: an unknown key is refused, so a typo never leaves an endpoint open. One
`WebConfig` serves `kvguardian.core.exporters.http.MetricsHTTPServer` and ASGI apps (`uvicorn_ssl_options`,
`BasicAuthASGI`). bcrypt runs off the event loop; successes are cached as salted digests, unknown users are
checked against a dummy hash. File format and costs: docs/design/exporters.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError, require

__all__ = [
    "BasicAuthASGI",
    "WebConfig",
    "basic_user",
    "load_web_config",
    "serve_asgi",
]

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
             "cipher_suites", "curve_preferences", "prefer_server_cipher_suites"}
_TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
_CACHE_LIMIT = 256
REALM = 'Basic realm="kv-guardian", charset="UTF-8"'


@dataclass(frozen=True)
class WebConfig:
    """A parsed web configuration. ``WebConfig()`` (no TLS, no users) serves plain HTTP, as without a file."""

    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    source: str = ""  # the file it came from, for messages
    _cache: OrderedDict[bytes, bool] = field(default_factory=OrderedDict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _pepper: bytes = field(default_factory=lambda: secrets.token_bytes(16), repr=False, compare=False)

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    @property
    def auth(self) -> bool:
        return bool(self.users)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server-side context, or None without TLS.

        Raises:
            UsageError: a certificate or key that cannot be loaded (names the file).
        """
        if not self.tls:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _TLS_VERSIONS[self.min_version]
        if self.max_version:
            ctx.maximum_version = _TLS_VERSIONS[self.max_version]
        try:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
            if self.client_ca_file:
                ctx.load_verify_locations(cafile=self.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--web-config {self.source}: cannot load the TLS certificate/key "
                             f"({self.cert_file}, {self.key_file}): {exc}; fix: point cert_file/key_file at a "
                             "PEM certificate and its private key") from None
        ctx.verify_mode = _CLIENT_AUTH[self.client_auth_type]
        return ctx

    def uvicorn_ssl_options(self) -> dict[str, Any]:
        """Keyword arguments for ``uvicorn.Config`` (empty without TLS)."""
        if not self.tls:
            return {}
        self.ssl_context()  # fail early, with the one-line message
        opts: dict[str, Any] = {"ssl_certfile": self.cert_file, "ssl_keyfile": self.key_file,
                                "ssl_cert_reqs": int(_CLIENT_AUTH[self.client_auth_type])}
        if self.client_ca_file:
            opts["ssl_ca_certs"] = self.client_ca_file
        return opts

    def check_header(self, header: str | None) -> bool:
        """True when ``header`` (an ``Authorization`` value) carries valid basic-auth credentials, or when no
        users are configured. Costs one bcrypt check per credential not seen before."""
        if not self.users:
            return True
        creds = _parse_basic(header)
        if creds is None:
            return False
        user, password = creds
        digest = hmac.new(self._pepper, user.encode() + b"\x00" + password.encode(), hashlib.sha256).digest()
        with self._lock:
            if self._cache.get(digest):
                self._cache.move_to_end(digest)
                return True
        ok = _bcrypt_check(password, self.users.get(user))
        if ok:
            with self._lock:
                self._cache[digest] = True
                while len(self._cache) > _CACHE_LIMIT:
                    self._cache.popitem(last=False)
        return ok


def _parse_basic(header: str | None) -> tuple[str, str] | None:
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        raw = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    user, sep, password = raw.partition(":")
    return (user, password) if sep else None


def basic_user(header: str | None) -> str | None:
    """The user name of a basic-auth ``Authorization`` value (not checked: `WebConfig.check_header` does)."""
    creds = _parse_basic(header)
    return creds[0] if creds else None


_DUMMY: list[bytes] = []  # a real hash of a random password: unknown users cost a bcrypt check too


def _bcrypt_check(password: str, hashed: bytes | None) -> bool:
    bcrypt: Any = require("bcrypt", "web")
    if hashed is None and not _DUMMY:
        _DUMMY.append(bcrypt.hashpw(secrets.token_bytes(16).hex().encode(), bcrypt.gensalt(rounds=10)))
    try:
        ok = bool(bcrypt.checkpw(password.encode("utf-8"), hashed or _DUMMY[0]))
    except ValueError:  # a malformed stored hash: refuse
        ok = False
    return ok and hashed is not None


def load_web_config(path: str | os.PathLike[str] | None) -> WebConfig:
    """Read an exporter-toolkit web configuration; ``None`` gives the plain-HTTP, no-auth config.

    Raises:
        UsageError: the file cannot be read, is not YAML, has unknown keys, names missing files, or holds
            a hash that is not bcrypt (one line naming the file and the key).
    """
    if path is None:
        return WebConfig()
    yaml: Any = require("yaml", "web")
    p = Path(path)
    where = f"--web-config {p}"
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{where}: cannot read it ({exc}); fix: pass a readable YAML file") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise UsageError(f"{where}: the top level must be a mapping with tls_server_config / basic_auth_users")
    _no_unknown(where, "", data, _TOP_KEYS)
    tls = _tls_fields(where, p.parent, data.get("tls_server_config") or {})
    users = _users(where, data.get("basic_auth_users") or {})
    return WebConfig(users=users, source=str(p), **tls)


def _no_unknown(where: str, section: str, data: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise UsageError(f"{where}: unknown key {section}{unknown[0]!r}; known: {', '.join(sorted(known))}")


def _tls_fields(where: str, base: Path, tls: object) -> dict[str, Any]:
    if not isinstance(tls, dict):
        raise UsageError(f"{where}: tls_server_config must be a mapping")
    _no_unknown(where, "tls_server_config.", tls, _TLS_KEYS)
    if not tls:
        return {}
    out: dict[str, Any] = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        value = tls.get(key)
        if value is None:
            continue
        f = Path(str(value))
        f = f if f.is_absolute() else base / f
        if not f.is_file():
            raise UsageError(f"{where}: tls_server_config.{key} {str(value)!r} does not exist ({f})")
        out[key] = str(f)
    if "cert_file" not in out or "key_file" not in out:
        raise UsageError(f"{where}: tls_server_config needs both cert_file and key_file")
    auth = str(tls.get("client_auth_type") or "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise UsageError(f"{where}: client_auth_type {auth!r} is not one of {', '.join(_CLIENT_AUTH)}")
    if "Verify" in auth and "client_ca_file" not in out:
        raise UsageError(f"{where}: client_auth_type {auth} needs client_ca_file")
    out["client_auth_type"] = auth
    for key in ("min_version", "max_version"):
        v = tls.get(key)
        if v is not None and str(v) not in _TLS_VERSIONS:
            raise UsageError(f"{where}: tls_server_config.{key} {v!r} is not one of {', '.join(_TLS_VERSIONS)}")
        if v is not None:
            out[key] = str(v)
    return out


def _users(where: str, users: object) -> dict[str, bytes]:
    if not isinstance(users, dict):
        raise UsageError(f"{where}: basic_auth_users must map user names to bcrypt hashes")
    out = {}
    for user, hashed in users.items():
        h = str(hashed or "").encode("ascii", "replace")
        if not (h[:4] in (b"$2a$", b"$2b$", b"$2y$") and len(h) == 60):
            raise UsageError(f"{where}: basic_auth_users.{user}: not a bcrypt hash (expected '$2y$10$' and 53 "
                             "more characters); fix: htpasswd -nBC 10 USER, or python -c 'import bcrypt; "
                             "print(bcrypt.hashpw(b\"PASSWORD\", bcrypt.gensalt()).decode())'")
        out[str(user)] = h
    return out


# ---------------------------------------------------------------------------------------------- ASGI
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BasicAuthASGI:
    """ASGI middleware: HTTP requests need valid basic-auth credentials, except paths for which ``exempt``
    returns True (e.g. an API that has its own bearer keys). bcrypt runs in a worker thread."""

    def __init__(self, app: Callable[..., Awaitable[None]], config: WebConfig,
                 exempt: Callable[[str], bool] | None = None) -> None:
        self.app = app
        self.config = config
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.config.auth or (self.exempt and self.exempt(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"authorization"),
                      None)
        ok = await asyncio.get_running_loop().run_in_executor(None, self.config.check_header, header)
        if ok:
            await self.app(scope, receive, send)
            return
        body = b"401 Unauthorized\n"
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", REALM.encode())]})
        await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serve_asgi(app: Callable[[Scope, Receive, Send], Awaitable[None]], *, host: str = "127.0.0.1", port: int = 0,
               config: WebConfig | None = None, timeout: float = 30.0, lifespan: str = "off") -> Iterator[str]:
    """Run ``app`` under uvicorn in a thread on ``host:port`` (0: a free port) with ``config``'s TLS; yield the
    base URL (``http://`` or ``https://``); stop the server on exit. Basic auth is the app's business
    (wrap it in `BasicAuthASGI`).

    Raises:
        UsageError: the port cannot be bound (exit code 3) or the certificate cannot be loaded.
        RuntimeError: uvicorn did not start within ``timeout`` seconds.
    """
    uvicorn: Any = require("uvicorn", "serve")
    cfg = config or WebConfig()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it (Linux)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot serve on {host}:{port}: {exc.strerror or exc}; fix: pick a free port",
                         exit_code=EXIT_ENVIRONMENT) from None
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan, access_log=False,
                                           **cfg.uvicorn_ssl_options()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="kvg-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"uvicorn did not start on {host}:{bound} within {timeout:.0f} s")
        time.sleep(0.01)
    name = f"[{host}]" if ":" in host else host
    try:
        yield f"{cfg.scheme}://{name}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout)
        sock.close()
