"""A snapshot fetched from a running server the way ``redis-cli --rdb`` does: the replication handshake.

``REPLCONF rdb-only 1``, ``REPLCONF capa eof``, ``SYNC``; the payload is streamed straight into the RDB reader
(nothing on disk, memory flat) while the server's forked child serializes the data set. The user needs the
``sync`` and ``replconf`` commands, which a read-only scan user lacks. The handshake: docs/design/keyspace.md.
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import unquote, urlsplit

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError

__all__ = ["Snapshot", "open_snapshot"]

_MARK = 40


class Snapshot:
    """The RDB payload of a SYNC, readable as a binary stream (``read``); ``length`` is None in diskless mode."""

    def __init__(self, sock: socket.socket, rest: bytes, length: int | None, where: str) -> None:
        self.sock = sock
        self.pending = rest  # payload bytes that came with the reply header
        self.length = length
        self.where = where
        self.received = 0

    def read(self, n: int) -> bytes:
        if self.pending:
            out, self.pending = self.pending[:n], self.pending[n:]
        else:
            try:
                out = self.sock.recv(min(n, 1 << 20))
            except TimeoutError:
                raise UsageError(f"{self.where} stopped sending the snapshot after {self.received} bytes "
                                 "(timed out)", exit_code=EXIT_ENVIRONMENT) from None
            except OSError as exc:
                raise UsageError(f"{self.where} closed the replication link after {self.received} bytes: {exc}",
                                 exit_code=EXIT_ENVIRONMENT) from None
        self.received += len(out)
        return out

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _resp(*args: str | bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _Lines:
    """Reply lines read off the socket before the payload starts."""

    def __init__(self, sock: socket.socket, where: str) -> None:
        self.sock, self.where, self.buf = sock, where, b""

    def line(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise UsageError(f"{self.where} closed the connection during the replication handshake",
                                 exit_code=EXIT_ENVIRONMENT)
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.rstrip(b"\r")


def _connect(url: str, timeout: float, where: str) -> socket.socket:
    parts = urlsplit(url)
    try:
        if parts.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(unquote(parts.path))
            return sock
        sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=timeout)
        if parts.scheme == "rediss":
            ctx = ssl.create_default_context()
            sock = ctx.wrap_socket(sock, server_hostname=parts.hostname)
        return sock
    except OSError as exc:
        raise UsageError(f"cannot connect to {where}: {exc.strerror or exc}; is the server running?",
                         exit_code=EXIT_ENVIRONMENT) from None


def _command(sock: socket.socket, lines: _Lines, *args: str) -> bytes:
    sock.sendall(_resp(*args))
    return lines.line()


def _refused(reply: bytes, what: str, where: str) -> UsageError:
    text = reply.decode("utf-8", "replace")[:200]
    hint = ("; the user needs +sync +replconf (a replication snapshot), or read a saved file with "
            "kv-guardian redis rdb FILE") if "NOPERM" in text or "permission" in text else ""
    return UsageError(f"{where} refused {what}: {text}{hint}", exit_code=EXIT_ENVIRONMENT)


def open_snapshot(url: str, where: str, *, timeout: float = 10.0) -> Snapshot:
    """Start a replication snapshot of ``url`` and return its payload stream (``where``: the URL to show).

    Raises:
        UsageError: the server is unreachable, the password is wrong, or the user may not replicate.
    """
    parts = urlsplit(url)
    sock = _connect(url, timeout, where)
    lines = _Lines(sock, where)
    try:
        if parts.password is not None:
            auth = (unquote(parts.username), unquote(parts.password)) if parts.username else (unquote(parts.password),)
            reply = _command(sock, lines, "AUTH", *auth)
            if not reply.startswith(b"+"):
                raise _refused(reply, "AUTH", where)
        _command(sock, lines, "REPLCONF", "rdb-only", "1")  # an error (Redis < 7.0) is fine: SYNC still works
        _command(sock, lines, "REPLCONF", "capa", "eof")  # a diskless snapshot is fine: no disk write on the server
        sock.sendall(_resp("SYNC"))
        while True:
            line = lines.line()
            if line:  # empty lines are keepalives while the server prepares the snapshot
                break
        return _payload(sock, lines, line, where)
    except BaseException:
        sock.close()
        raise


def _payload(sock: socket.socket, lines: _Lines, line: bytes, where: str) -> Snapshot:
    if line.startswith(b"-"):
        raise _refused(line, "SYNC", where)
    if not line.startswith(b"$"):
        raise UsageError(f"{where} answered SYNC with {line[:60]!r}, not a snapshot", exit_code=EXIT_ENVIRONMENT)
    if line.startswith(b"$EOF:"):  # diskless: the payload ends with the 40-byte mark; the reader stops at EOF
        if len(line) != 5 + _MARK:
            raise UsageError(f"{where} sent a bad diskless snapshot header", exit_code=EXIT_ENVIRONMENT)
        return Snapshot(sock, lines.buf, None, where)
    try:
        length = int(line[1:])
    except ValueError:
        raise UsageError(f"{where} sent a bad snapshot header {line[:60]!r}", exit_code=EXIT_ENVIRONMENT) from None
    return Snapshot(sock, lines.buf, length, where)
