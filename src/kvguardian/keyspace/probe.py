"""Reading per-key facts without side effects: one read-only Lua call per batch, or a pipeline.

Per key: type, ``MEMORY USAGE``, ``PTTL`` and ``OBJECT IDLETIME`` (or ``FREQ``), none of which writes or resets
idle time. The Lua path is ``EVALSHA_RO`` with ``no-writes`` (Redis ≥ 7.0, works on every Cluster master); without
scripting the same commands go as a pipeline. A `Lane` keeps one request in flight per server, the probe of one
batch and the ``SCAN`` of the next in one write. Details: docs/design/keyspace.md.
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError
from kvguardian.keyspace.stats import TYPE_CODE

if TYPE_CHECKING:
    import redis

__all__ = ["LUA_PROBE", "LUA_SCAN_PROBE", "Lane", "choose_mode"]

#: the parts the two scripts share: the prelude, the four reads of one key ``k`` (appended to ``out`` at
#: ``n``), and the closing TIME pair (-1s when the ACL user may not call TIME: the client then times the round trip)
_LUA_PRELUDE = """local call, pcall = redis.call, redis.pcall
local codes = {string = 0, list = 1, set = 2, zset = 3, hash = 4, stream = 5, none = -1}
local sub = ARGV[1]
local t0 = pcall('TIME')
"""
_LUA_READ_KEY = """  local code = codes[call('TYPE', k)['ok']] or 6
  local m, p, idle = -1, -2, -1
  if code >= 0 then
    m = call('MEMORY', 'USAGE', k) or -1
    p = call('PTTL', k)
    idle = pcall('OBJECT', sub, k)
    if type(idle) ~= 'number' then idle = -1 end
  end
  out[n + 1] = code
  out[n + 2] = m
  out[n + 3] = p
  out[n + 4] = idle
  n = n + 4
end
"""
_LUA_TIMES = """local t1 = pcall('TIME')
if type(t0) ~= 'table' or t0.err or type(t1) ~= 'table' or t1.err then
  t0, t1 = {-1, -1}, {-1, -1}
end
out[n + 1] = tonumber(t0[1])
out[n + 2] = tonumber(t0[2])
out[n + 3] = tonumber(t1[1])
out[n + 4] = tonumber(t1[2])
return out
"""

LUA_PROBE = (
    """#!lua flags=no-writes,allow-cross-slot-keys
-- kv-guardian key probe: read-only, keys come as ARGV[2..n]; ARGV[1] is IDLETIME or FREQ
-- the last four numbers are TIME at the start and at the end (s, us): the script's own run time
-- (-1s when the ACL user may not call TIME: the client then times the round trip)
"""
    + _LUA_PRELUDE
    + """local out = {}
local n = 0
for i = 2, #ARGV do
  local k = ARGV[i]
"""
    + _LUA_READ_KEY
    + _LUA_TIMES
)
LUA_SHA = hashlib.sha1(LUA_PROBE.encode()).hexdigest()

#: the scan's usual call: SCAN one step and probe what it returned, in one script. Nothing goes back and
#: forth per key but the reply, and the server never waits for the client between a SCAN and its probe.
LUA_SCAN_PROBE = (
    """#!lua flags=no-writes,allow-cross-slot-keys
-- kv-guardian scan + probe: read-only. ARGV: IDLETIME or FREQ, cursor, COUNT[, MATCH glob]
-- reply: next cursor, n, the n key names, 4 numbers per key, TIME at the start and at the end (s, us)
"""
    + _LUA_PRELUDE
    + """local scan
if ARGV[4] then
  scan = call('SCAN', ARGV[2], 'COUNT', ARGV[3], 'MATCH', ARGV[4])
else
  scan = call('SCAN', ARGV[2], 'COUNT', ARGV[3])
end
local keys = scan[2]
local nk = #keys
local out = {scan[1], nk}
for i = 1, nk do out[2 + i] = keys[i] end
local n = 2 + nk
for i = 1, nk do
  local k = keys[i]
"""
    + _LUA_READ_KEY
    + _LUA_TIMES
)
LUA_SCAN_SHA = hashlib.sha1(LUA_SCAN_PROBE.encode()).hexdigest()


def choose_mode(client: redis.Redis, version: tuple[int, ...], sub: str, wanted: str = "auto") -> tuple[str, str]:
    """``("lua" | "pipeline", why)``: Lua when the server and the ACL allow a read-only script."""
    import redis

    if wanted == "pipeline":
        return "pipeline", "asked for with --mode pipeline"
    if version and version < (7, 0):
        why = f"Redis {'.'.join(map(str, version))} has no EVALSHA_RO or script flags (they need 7.0)"
        if wanted == "lua":
            raise UsageError(f"--mode lua: {why}; use --mode auto", exit_code=EXIT_ENVIRONMENT)
        return "pipeline", why
    try:
        client.execute_command("EVAL_RO", LUA_PROBE, 0, sub)  # loads the scripts into the script cache
        client.execute_command("EVALSHA_RO", LUA_SHA, 0, sub)
        client.execute_command("EVAL_RO", LUA_SCAN_PROBE, 0, sub, 0, 1)  # one SCAN step of one key: a read
        return "lua", "EVALSHA_RO with flags=no-writes"
    except redis.ResponseError as exc:
        why = f"scripting is not allowed here ({str(exc).splitlines()[0][:160]})"
        if wanted == "lua":
            raise UsageError(f"--mode lua: {why}; use --mode auto", exit_code=EXIT_ENVIRONMENT) from None
        return "pipeline", why


def _split_timing(reply: object) -> tuple[np.ndarray, float]:
    """The probe script's reply: the [N, 4] probe and the script's run time in seconds (its last row)."""
    arr = np.asarray(reply, dtype=np.int64).reshape(-1, 4)
    t = arr[-1]
    if t[0] < 0:  # no TIME for this user
        return arr[:-1], -1.0
    return arr[:-1], float(t[2] - t[0]) + (t[3] - t[1]) / 1e6


def _resp(args: tuple[Any, ...]) -> bytes:
    """One command in the Redis protocol (one write per batch; cheaper per key than redis-py's packer)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if a.__class__ is bytes else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _no_script(exc: Exception) -> bool:
    """The server no longer has the script (SCRIPT FLUSH, a restart); redis-py drops the NOSCRIPT prefix."""
    import redis

    return isinstance(exc, redis.exceptions.NoScriptError) or "NOSCRIPT" in str(exc)


def _permission_error(exc: Exception, where: str) -> UsageError:
    return UsageError(f"Redis at {where} refused a read-only probe command ({str(exc)[:200]}); the ACL user needs "
                      "+scan +type +pttl +memory|usage +object|idletime +object|freq (see README)",
                      exit_code=EXIT_ENVIRONMENT)


class Lane:
    """One server's scan: SCAN cursor, the batch in flight, the probe mode."""

    def __init__(self, client: redis.Redis, where: str, *, mode: str, sub: str, batch: int,
                 match: bytes | None) -> None:
        self.client = client
        self.where = where
        self.mode = mode  # "lua" or "pipeline"
        self.sub = sub  # "IDLETIME" or "FREQ"
        self.batch = batch
        self.match = match
        self.cursor = 0  # the next SCAN cursor (0 after the last batch)
        self.last_call_s = -1.0  # server time of the last probe: the script's own TIME, or the round trip
        self._sent_at = 0.0
        self._conn = client.connection_pool.get_connection()
        self._sent: tuple[list[bytes], bool] | None = None  # (keys probed, scan sent) of the request in flight
        self._scan_probe = False  # the request in flight is a LUA_SCAN_PROBE call
        self.moved = 0  # keys that answered MOVED or ASK (a Cluster resharding): counted as vanished

    def close(self, *, broken: bool = False) -> None:
        """Give the connection back; drop it if replies are still unread or the scan broke off."""
        if broken or self._sent is not None:
            self._conn.disconnect()
        self.client.connection_pool.release(self._conn)

    def _scan_args(self) -> list[Any]:
        args: list[Any] = ["SCAN", self.cursor, "COUNT", self.batch]
        if self.match is not None:
            args += ["MATCH", self.match]
        return args

    def send(self, keys: list[bytes], *, scan: bool) -> None:
        """Send the probe of ``keys`` and, if ``scan``, the next SCAN, in one write. In Lua mode with no keys
        to probe, the next SCAN step and its probe go as one script (`LUA_SCAN_PROBE`): `receive` then
        returns that step's keys, probed."""
        if self.mode == "lua" and scan and not keys:
            args: list[Any] = ["EVALSHA_RO", LUA_SCAN_SHA, 0, self.sub, self.cursor, self.batch]
            if self.match is not None:
                args.append(self.match)
            self._conn.send_packed_command([_resp(tuple(args))], check_health=False)
            self._sent, self._scan_probe = ([], True), True
            self._sent_at = time.perf_counter()
            return
        self._scan_probe = False
        cmds: list[tuple[Any, ...]] = []
        if keys:
            if self.mode == "lua":
                cmds.append(("EVALSHA_RO", LUA_SHA, 0, self.sub, *keys))
            else:
                for k in keys:
                    cmds += [("TYPE", k), ("MEMORY", "USAGE", k), ("PTTL", k), ("OBJECT", self.sub, k)]
        if scan:
            cmds.append(tuple(self._scan_args()))
        self._conn.send_packed_command([b"".join(_resp(c) for c in cmds)], check_health=False)
        self._sent = (keys, scan)
        self._sent_at = time.perf_counter()

    def receive(self) -> tuple[list[bytes], np.ndarray | None, list[bytes]]:
        """Read what `send` asked for: (probed keys, probe [N, 4] or None, keys of the next SCAN batch)."""
        import redis

        assert self._sent is not None, "Lane.receive without send"
        keys, scan = self._sent
        self._sent = None
        if self._scan_probe:
            return self._receive_scan_probe()
        probe = None
        failed: Exception | None = None
        if keys:
            if self.mode == "lua":
                try:
                    probe, self.last_call_s = _split_timing(self._conn.read_response())
                    if self.last_call_s < 0:
                        self.last_call_s = time.perf_counter() - self._sent_at  # an upper bound: the round trip
                except redis.exceptions.NoPermissionError as exc:
                    raise _permission_error(exc, self.where) from None
                except redis.ResponseError as exc:
                    failed = exc  # read the SCAN reply first, then redo this batch
            else:
                probe = self._read_pipeline(len(keys))
                self.last_call_s = time.perf_counter() - self._sent_at  # an upper bound: the round trip
        next_keys: list[bytes] = []
        if scan:
            try:
                cursor, next_keys = self._conn.read_response()
            except redis.exceptions.NoPermissionError as exc:
                raise _permission_error(exc, self.where) from None
            self.cursor = int(cursor)
        if failed is not None:
            probe = self._redo(keys, failed)
        return keys, probe, list(next_keys)

    def _receive_scan_probe(self) -> tuple[list[bytes], np.ndarray | None, list[bytes]]:
        import redis

        try:
            reply = self._conn.read_response()
        except redis.exceptions.NoPermissionError as exc:
            raise _permission_error(exc, self.where) from None
        except redis.ResponseError as exc:
            return self._redo_scan(exc)
        n = int(reply[1])
        keys = list(reply[2:2 + n])
        probe, self.last_call_s = _split_timing(reply[2 + n:])
        if self.last_call_s < 0:
            self.last_call_s = time.perf_counter() - self._sent_at  # an upper bound: the round trip
        self.cursor = int(reply[0])
        return keys, probe, []

    def _redo_scan(self, failed: Exception) -> tuple[list[bytes], np.ndarray | None, list[bytes]]:
        """The scan-and-probe script failed (NOSCRIPT after SCRIPT FLUSH or a restart: reload it; a key that
        moved mid-call in a Cluster): SCAN that step on its own, then probe its keys as `_redo` does."""
        if _no_script(failed):
            self.client.execute_command("EVAL_RO", LUA_SCAN_PROBE, 0, self.sub, 0, 1)
        nxt, keys = self.client.execute_command(*self._scan_args())
        self.cursor = int(nxt)
        keys = list(keys)
        return keys, (self._redo(keys, failed) if keys else np.empty((0, 4), dtype=np.int64)), []

    def _redo(self, keys: list[bytes], failed: Exception) -> np.ndarray:
        """The script failed for this batch: reload it (NOSCRIPT after SCRIPT FLUSH or a restart), or probe
        command by command (a key that moved to another Cluster node answers MOVED and counts as gone)."""
        import redis

        if _no_script(failed):
            try:
                probe, self.last_call_s = _split_timing(
                    self.client.execute_command("EVAL_RO", LUA_PROBE, 0, self.sub, *keys))
                return probe
            except redis.exceptions.NoPermissionError:
                raise
            except redis.ResponseError:
                pass  # reloaded, and failed for a key of this batch (one that moved): command by command
        cmds = [c for k in keys for c in (("TYPE", k), ("MEMORY", "USAGE", k), ("PTTL", k), ("OBJECT", self.sub, k))]
        self._conn.send_packed_command([b"".join(_resp(c) for c in cmds)], check_health=False)
        return self._read_pipeline(len(keys))

    def _read_pipeline(self, n: int) -> np.ndarray:
        import redis

        out = np.full((n, 4), -1, dtype=np.int64)
        denied: Exception | None = None
        for i in range(n):
            for j in range(4):
                try:
                    v = self._conn.read_response()
                except redis.exceptions.NoPermissionError as exc:
                    denied = exc
                    continue
                except redis.ResponseError as exc:
                    if j == 0 and isinstance(exc, redis.exceptions.AskError):  # MovedError too
                        self.moved += 1
                    continue  # e.g. OBJECT on a key that vanished, MOVED: stays -1
                if j == 0:
                    out[i, 0] = TYPE_CODE.get(v, 6) if v != b"none" else -1
                elif v is not None:
                    out[i, j] = int(v)
                elif j == 2:
                    out[i, 2] = -2
        if denied is not None:
            raise _permission_error(denied, self.where)
        return out
