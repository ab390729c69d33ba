"""Hostile servers for the tests: real sockets on 127.0.0.1 that misbehave the ways servers (or attackers) do.

``HostileServer(mode)`` listens on a free loopback port; each connection is answered by one behaviour:

===================  ======================================================================================
``trickle``          valid HTTP headers, then the body one byte per ``delay`` seconds (never finishing quickly)
``trickle-headers``  the headers too, one byte per ``delay`` seconds
``silent``           accepts and reads, never answers
``garbage``          random bytes, then close
``long-header``      a status line, then one header line of 70 KiB (over http.client's 64 KiB line limit)
``truncated``        ``Content-Length: 1000`` and 36 bytes of metrics, then close
``not-http``         a Redis error line (``-ERR unknown command``), as a Redis port answers an HTTP client
``http``             a valid HTTP 200 with an HTML page (what a Redis client gets from a web port)
``redis-reply``      answers every read with ``body`` (a canned RESP reply, e.g. a non-Redis ``E``)
``metrics``          a valid Prometheus page (``body``), for comparison
===================  ======================================================================================

``zmq_garbage(endpoint)`` publishes frames that are not vLLM KV events. Used by the watch, Redis and exporter
tests; everything stays on loopback, every thread is a daemon and stops with `HostileServer.close`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

__all__ = ["MODES", "HostileServer", "idle_connections", "zmq_garbage"]

MODES = ("trickle", "trickle-headers", "silent", "garbage", "long-header", "truncated", "not-http", "http",
         "redis-reply", "metrics")

METRICS = b"# HELP up ok\n# TYPE up gauge\nup 1.0\n"


class HostileServer:
    def __init__(self, mode: str, *, body: bytes = METRICS, delay: float = 1.0) -> None:
        assert mode in MODES, mode
        self.mode, self.body, self.delay = mode, body, delay
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._clients: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._clients.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            getattr(self, "_" + self.mode.replace("-", "_"))(conn)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    @staticmethod
    def _head(length: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n" % length

    def _headers(self, conn: socket.socket, length: int) -> None:
        conn.recv(65536)
        conn.sendall(self._head(length))

    def _drip(self, conn: socket.socket, data: bytes) -> None:
        for b in data:
            if self._stop.wait(self.delay):
                return
            conn.sendall(bytes([b]))

    def _trickle(self, conn: socket.socket) -> None:
        self._headers(conn, len(self.body))
        self._drip(conn, self.body)

    def _trickle_headers(self, conn: socket.socket) -> None:
        conn.recv(65536)
        self._drip(conn, self._head(len(self.body)) + self.body)

    def _silent(self, conn: socket.socket) -> None:
        while not self._stop.is_set() and conn.recv(65536):
            pass

    def _garbage(self, conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(os.urandom(4096))

    def _long_header(self, conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n" + METRICS)

    def _truncated(self, conn: socket.socket) -> None:
        self._headers(conn, 1000)
        conn.sendall(METRICS)

    def _not_http(self, conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"-ERR unknown command 'GET', with args beginning with: '/metrics'\r\n")

    def _http(self, conn: socket.socket) -> None:
        page = b"<html><body>hello</body></html>"
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))

    def _redis_reply(self, conn: socket.socket) -> None:
        while not self._stop.is_set() and conn.recv(65536):
            conn.sendall(self.body)

    def _metrics(self, conn: socket.socket) -> None:
        self._headers(conn, len(self.body))
        conn.sendall(self.body)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for c in self._clients:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def idle_connections(host: str, port: int, n: int, *, first_bytes: bytes = b"GET /metrics HTTP/1.1\r\n") -> list[Any]:
    """``n`` connections to ``host:port`` that each send half a request and then nothing (a slow loris).
    Connections the server refuses or resets are simply fewer; close the returned sockets when done."""
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect((host, port))
            s.sendall(first_bytes)
            out.append(s)
        except OSError:
            s.close()
    return out


def threads_of(pid: int) -> int:
    """The number of threads process ``pid`` runs (Linux /proc)."""
    import re
    from pathlib import Path

    m = re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert m is not None
    return int(m.group(1))


def loris_flood(pid: int, port: int, probe: Any, *, n: int = 3000, first_bytes: bytes = b"GET /metrics HTTP/1.1\r\n",
                ) -> dict[str, Any]:
    """Hold ``n`` idle half-requests open against process ``pid`` on 127.0.0.1:``port``, then call ``probe()``
    (a real request). Returns the connections made, the threads before and during the flood, the probe's
    answer and how long it took; every flood socket is closed before it returns."""
    baseline = threads_of(pid)
    loris = idle_connections("127.0.0.1", port, n, first_bytes=first_bytes)
    try:
        time.sleep(1.0)
        t0 = time.monotonic()
        answer = probe()
        took = time.monotonic() - t0
        threads = threads_of(pid)
    finally:
        for s in loris:
            s.close()
    return {"connections": len(loris), "baseline": baseline, "threads": threads, "answer": answer, "seconds": took}


def zmq_garbage(endpoint: str, *, count: int = 200, seconds: float = 5.0) -> threading.Thread:
    """A thread publishing ``count`` multipart messages that are not KV events (wrong frame counts, short
    sequences, random payloads) on ``endpoint`` (binds), spread over at most ``seconds``."""
    import zmq

    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.bind(endpoint)

    def run() -> None:
        try:
            t_end = time.monotonic() + seconds
            for i in range(count):
                frames = [[os.urandom(i % 9)], [b"", os.urandom(3), os.urandom(40)],
                          [b"", (i).to_bytes(8, "big"), os.urandom(i % 64)], [b"x"] * (i % 6)][i % 4]
                pub.send_multipart(frames)
                time.sleep(max(0.0, min(0.02, t_end - time.monotonic())))
        finally:
            pub.close(linger=0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t
