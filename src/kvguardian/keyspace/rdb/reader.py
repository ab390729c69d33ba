"""A streaming reader of RDB snapshots: per key its name, type, estimated memory, expiry and idle time / LFU
counter, a batch at a time; values are skipped by their lengths, never built.

Memory stays flat in the file's size: the file is read in 1 MiB chunks and only the current batch of key
names is kept. Strings (most keys) are handled inline in the main loop; collections go through one small
reader per RDB value type (`_VALUE_READERS`). Module values are skipped through their self-describing
opcodes (module v2 format), without the module.

A damaged or truncated file raises `RdbError` with the byte offset; the batches read before it stay valid,
so a caller can report a partial result.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import ClassVar, Protocol

import numpy as np

from kvguardian.keyspace.rdb.checksum import Crc64, Verdict
from kvguardian.keyspace.rdb.format import OP, TYPE_CODES, VERSIONS, RdbError
from kvguardian.keyspace.rdb.size import ROBJ, blob_bytes, je, key_bytes, sds, string_bytes, table_bytes

__all__ = ["Batch", "ByteStream", "RdbReader", "lzf_decompress"]

class ByteStream(Protocol):
    """A file opened in binary mode, or a replication payload (`kvguardian.keyspace.rdb.snapshot.Snapshot`)."""

    def read(self, n: int, /) -> bytes: ...

CHUNK = 1 << 20
#: most bytes asked of the stream at once: a length field is data from the file, and read(2**62) of a damaged
#: one would try to allocate it all (MemoryError) instead of finding that the file ends first
MAX_READ = 64 << 20
_HEADROOM = 64  # bytes a record's opcode, expiry, idle and length prefixes fit in
_ZSET_NODE = 53  # a skiplist node (24 bytes + 16 a level), averaged over levels (p = 1/4) and size classes
_QUICKLIST = 40  # struct quicklist
_QL_NODE = 32  # struct quicklistNode
_RAX_NODE = 48  # a stream's radix-tree node per listpack (key + child pointer), on average
_STREAM_NODE_PREALLOC = 4096  # a server appending to a stream allocates each node's listpack 4 KiB up front
_PEL_ENTRY = 48  # a pending entry: streamNACK + its radix-tree slot
_I64 = struct.Struct("<q")  # EXPIRETIME_MS: signed milliseconds, as Redis reads them
_INLINE = 4096  # bytes kept ahead of the inline path: a short string key and value always fit
_EOF, _NEW_DB = 1, 2  # what `_record` met
_D = struct.Struct("<d")


def lzf_decompress(data: bytes, out_len: int) -> bytes:
    """LZF as Redis writes it (liblzf's format): literal runs and back references."""
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        ctrl = data[i]
        i += 1
        if ctrl < 32:  # a literal run of ctrl + 1 bytes
            out += data[i:i + ctrl + 1]
            i += ctrl + 1
            continue
        length = ctrl >> 5
        if length == 7:
            length += data[i]
            i += 1
        ref = len(out) - ((ctrl & 0x1F) << 8) - data[i] - 1
        i += 1
        length += 2
        if ref < 0:
            raise ValueError("LZF back reference before the start")
        if ref + length <= len(out):
            out += out[ref:ref + length]
        else:  # overlapping copy: byte by byte
            for k in range(length):
                out.append(out[ref + k])
    if len(out) != out_len:
        raise ValueError(f"LZF data decompressed to {len(out)} bytes, {out_len} expected")
    return bytes(out)


class Batch:
    """One batch of keys: their names, and their numbers as one int64 array of four columns (a plain class,
    not a dataclass: importing the reader stays free of generated code)."""

    __slots__ = ("cols", "db", "keys")

    def __init__(self, keys: list[bytes] | None = None, cols: np.ndarray | None = None, db: int = 0) -> None:
        self.keys: list[bytes] = [] if keys is None else keys
        #: [N, 4] int64: type code (kvguardian.keyspace.stats.TYPES), estimated memory
        #: (kvguardian.keyspace.rdb.size), expiry (absolute Unix ms, -1: none), idle seconds (IDLE) or LFU
        #: counter (FREQ), -1: none
        self.cols: np.ndarray = np.empty((0, 4), dtype=np.int64) if cols is None else cols
        self.db = db  # the database every key of the batch is in

    def __len__(self) -> int:
        return len(self.keys)

    types = property(lambda self: self.cols[:, 0], doc="each key's type code")
    sizes = property(lambda self: self.cols[:, 1], doc="each key's estimated memory in bytes")
    expires = property(lambda self: self.cols[:, 2], doc="each key's expiry (ms since the epoch), -1: none")
    idles = property(lambda self: self.cols[:, 3], doc="each key's IDLE seconds or FREQ counter, -1: none")


class _Filling:
    """A batch being read: key names, the numbers of the keys `RdbReader._fast` read (arrays, a run at a
    time) and of those `RdbReader._record` read (rows), kept in file order."""

    def __init__(self, db: int) -> None:
        self.keys: list[bytes] = []
        self.db = db
        self.parts: list[np.ndarray] = []
        self.rows: list[tuple[int, int, int, int]] = []

    def add_run(self, cols: np.ndarray) -> None:
        self._flush_rows()
        self.parts.append(cols)

    def add_row(self, key: bytes, row: tuple[int, int, int, int]) -> None:
        self.keys.append(key)
        self.rows.append(row)

    def _flush_rows(self) -> None:
        if self.rows:
            self.parts.append(np.array(self.rows, dtype=np.int64).reshape(-1, 4))
            self.rows = []

    def batch(self) -> Batch:
        self._flush_rows()
        cols = (self.parts[0] if len(self.parts) == 1 else np.concatenate(self.parts) if self.parts
                else np.empty((0, 4), dtype=np.int64))
        return Batch(self.keys, cols, self.db)


class RdbReader:
    """Reads an RDB from a binary stream (a file, or a replication socket's payload).

    Attributes after `batches` ends: ``aux`` (the AUX fields: redis-ver, ctime, used-mem, ...), ``version``,
    ``saw_idle`` / ``saw_freq`` (keys carried IDLE / FREQ opcodes), ``modules_skipped``, ``offset``.
    """

    def __init__(self, stream: ByteStream, *, batch: int = 4096, limit: int | None = None) -> None:
        self.f = stream
        self.batch = batch
        self.limit = limit  # bytes the stream holds (a replication payload), None: up to EOF
        self.buf = b""
        self.pos = 0
        self.base = 0  # offset of buf[0] in the stream
        self.version = 0
        self.aux: dict[str, str] = {}
        self.saw_idle = self.saw_freq = False
        self.modules_skipped = 0
        self.functions = 0
        self.done = False  # the EOF opcode was read
        self.crc = Crc64()  # over the bytes before ``base`` (and, at the EOF opcode, up to it)
        self.checksum = Verdict.UNREAD  # the trailing CRC64 against the bytes read (`checksum.Verdict`)
        self.db = 0  # the database being read
        self.expire = self.idle = -1  # what the per-key opcodes before the next key set

    # ------------------------------------------------------------------ the buffer
    @property
    def offset(self) -> int:
        return self.base + self.pos

    def _fill(self, n: int) -> bool:
        """Make ``n`` bytes available at ``pos``; False if the stream ends first."""
        have = len(self.buf) - self.pos
        parts = [self.buf[self.pos:]]
        while have < n:
            want = max(CHUNK, min(n - have, MAX_READ))
            if self.limit is not None:
                want = min(want, self.limit - self.base - self.pos - have)
                if want <= 0:
                    break
            chunk = self.f.read(want)
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        self.crc.fold(memoryview(self.buf)[:self.pos])
        self.base += self.pos
        self.buf = b"".join(parts)
        self.pos = 0
        return have >= n

    def need(self, n: int) -> None:
        if self.pos + n > len(self.buf) and not self._fill(n):
            raise RdbError(f"the file ends in the middle of a record (needed {n} more bytes)", self.offset)

    def skip(self, n: int) -> None:
        left = len(self.buf) - self.pos
        if n <= left:
            self.pos += n
            return
        n -= left
        self.crc.fold(self.buf)
        self.base += len(self.buf)
        self.buf, self.pos = b"", 0
        while n > 0:
            chunk = self.f.read(min(n, CHUNK))
            if not chunk:
                raise RdbError(f"the file ends inside a value ({n} bytes missing)", self.base)
            self.crc.fold(chunk)
            n -= len(chunk)
            self.base += len(chunk)

    def raw(self, n: int) -> bytes:
        self.need(n)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        self.need(1)
        b = self.buf[self.pos]
        self.pos += 1
        return b

    # ------------------------------------------------------------------ lengths and strings
    def length(self) -> tuple[int, int]:
        """(length, -1), or (-1, special encoding 0-3) for an integer or LZF string."""
        self.need(9)
        buf, pos = self.buf, self.pos
        b = buf[pos]
        t = b >> 6
        if t == 0:
            self.pos = pos + 1
            return b & 0x3F, -1
        if t == 1:
            self.pos = pos + 2
            return ((b & 0x3F) << 8) | buf[pos + 1], -1
        if b == 0x80:
            self.pos = pos + 5
            return int.from_bytes(buf[pos + 1:pos + 5], "big"), -1
        if b == 0x81:
            self.pos = pos + 9
            return int.from_bytes(buf[pos + 1:pos + 9], "big"), -1
        if t == 3:
            self.pos = pos + 1
            return -1, b & 0x3F
        raise RdbError(f"bad length byte 0x{b:02x}", self.offset)

    def plain_length(self) -> int:
        n, enc = self.length()
        if enc >= 0:
            raise RdbError("a string encoding where a length belongs", self.offset)
        return n

    def string(self) -> bytes:
        """A string's bytes (integers as their decimal digits, LZF decompressed)."""
        n, enc = self.length()
        if enc < 0:
            return self.raw(n)
        if enc <= 2:
            width = 1 << enc
            return str(int.from_bytes(self.raw(width), "little", signed=True)).encode()
        if enc == 3:
            clen, ulen = self._lzf_lengths()
            at = self.offset
            try:
                return lzf_decompress(self.raw(clen), ulen)
            except (ValueError, IndexError) as exc:
                raise RdbError(f"damaged LZF string: {exc}", at) from None
        raise RdbError(f"unknown string encoding {enc}", self.offset)

    def string_len(self) -> tuple[int, bool]:
        """Skip a string; (its length in memory, whether it was saved as an integer)."""
        n, enc = self.length()
        if enc < 0:
            self.skip(n)
            return n, False
        if enc <= 2:
            width = 1 << enc
            return len(str(int.from_bytes(self.raw(width), "little", signed=True))), True
        if enc == 3:
            clen, ulen = self._lzf_lengths()
            self.skip(clen)
            return ulen, False
        raise RdbError(f"unknown string encoding {enc}", self.offset)

    def _lzf_lengths(self) -> tuple[int, int]:
        """An LZF string's compressed and original lengths. LZF writes at most 264 bytes per 3-byte back
        reference, so an original length over 88 times the compressed one is a damaged file (read as it
        stands, one such key counted 5 million TiB)."""
        at = self.offset
        clen, ulen = self.plain_length(), self.plain_length()
        if ulen > 100 * clen + 64:  # 88 at most, measured 88.0 on a 10 MB run of one byte
            raise RdbError(f"damaged LZF string: {clen} compressed bytes cannot hold {ulen}", at)
        return clen, ulen

    # ------------------------------------------------------------------ the file
    def header(self) -> int:
        if not self._fill(9) or self.buf[:5] != b"REDIS":
            raise RdbError("not an RDB file (it does not start with REDIS and a version)", 0)
        try:
            self.version = int(self.buf[5:9])
        except ValueError:
            raise RdbError(f"bad RDB version {self.buf[5:9]!r}", 5) from None
        if self.version not in VERSIONS and self.version < VERSIONS.start:
            raise RdbError(f"RDB version {self.version} is older than this reader reads (9-12: Redis 5.0 to 8.x)", 5)
        self.pos = 9
        return self.version

    def batches(self) -> Iterator[Batch]:
        """Every key, ``batch`` at a time (a batch holds keys of one database). Raises `RdbError` at a damaged
        record; the batches before it are good."""
        if not self.version:
            self.header()
        while True:
            out = _Filling(self.db)
            try:
                full = self._run(out)
            except RdbError:
                if out.keys:  # the keys read before the damage are good: hand them out first
                    yield out.batch()
                raise
            if out.keys:
                yield out.batch()
            if not full:
                return

    def _run(self, out: _Filling) -> bool:
        """Fill ``out`` until it holds ``batch`` keys (True), the database changes (True) or the file ends
        (False). The common records (strings and single-blob values with short names, small lists: most keys
        of most servers) go through `_fast`, with no call per key; everything else, a record at a time,
        through `_record` (and so does the key after a per-key opcode `_record` read)."""
        keys = out.keys
        batch = self.batch
        buf, pos = self.buf, self.pos
        while len(keys) < batch:
            if pos + _INLINE > len(buf):
                self.pos = pos
                self._fill(_INLINE)
                buf, pos = self.buf, self.pos
            if self.expire < 0 and self.idle < 0:  # no per-key opcode pending
                pos = self._fast(out, buf, pos)
                if len(keys) >= batch:
                    break
            self.pos = pos + 1
            if pos >= len(buf):
                raise RdbError("the file ends without its EOF marker (truncated)", self.offset - 1)
            got = self._record(buf[pos], out)
            buf, pos = self.buf, self.pos
            if got == _EOF:
                return False
            if got == _NEW_DB and keys:
                return True
        self.pos = pos
        return True

    def _fast(self, out: _Filling, buf: bytes, pos: int) -> int:
        """The common records, with little work per key: an optional EXPIRETIME_MS, IDLE (6/14-bit) or FREQ,
        then a string or single-blob value with a short key. Runs while `_INLINE` bytes lie ahead (so a
        record's prefixes need no bounds checks) and the batch has room; stops at the start of the first
        record it does not handle and returns that position. The loop only finds where each record starts
        and its size; `_columns` then reads the opcodes, types, expiries and idle times of them all at once."""
        keys = out.keys
        tables, key_size = _FAST_TABLES, _KEY_SIZE
        end = len(buf)
        safe = end - _INLINE
        starts: list[int] = []
        sizes: list[int] = []
        for _ in range(self.batch - len(keys)):
            if pos >= safe:
                break
            start = pos
            t = buf[pos]
            if t == 0xFC:  # EXPIRETIME_MS
                pos += 9
                t = buf[pos]
            if t == 0xF8:  # IDLE
                b = buf[pos + 1]
                if b >= 128:
                    pos = start
                    break
                pos += 2 if b < 64 else 3
                t = buf[pos]
            elif t == 0xF9:  # FREQ
                pos += 2
                t = buf[pos]
            table = tables[t]
            kl = buf[pos + 1]
            if kl >= 64 or table is None:
                if t != 18 or kl >= 64:
                    pos = start
                    break
                vsize, q = _inline_quicklist(buf, pos + 2 + kl, end)  # a list
                if vsize < 0:
                    pos = start
                    break
            else:
                p = pos + 2 + kl
                b = buf[p]
                if b < 64:
                    vsize, q = table[b], p + 1 + b
                elif b == 0xC3 and buf[p + 1] < 64 and buf[p + 2] < 64:  # LZF, short lengths
                    vsize, q = table[buf[p + 2]], p + 3 + buf[p + 1]
                else:
                    vsize, q = _inline_value(buf, p, table)
                    if vsize < 0:
                        pos = start
                        break
            if q > end:
                pos = start
                break
            keys.append(buf[pos + 2:pos + 2 + kl])
            sizes.append(key_size[kl] + vsize)
            starts.append(start)
            pos = q
        if starts:
            out.add_run(self._columns(buf, starts, sizes))
        return pos

    def _columns(self, buf: bytes, starts: list[int], sizes: list[int]) -> np.ndarray:
        """The [N, 4] numbers of the records `_fast` found at ``starts``: their optional EXPIRETIME_MS and
        IDLE / FREQ opcodes and type bytes read with array operations."""
        b = np.frombuffer(buf, dtype=np.uint8)
        n = len(starts)
        at = np.fromiter(starts, dtype=np.int64, count=n)
        cols = np.full((n, 4), -1, dtype=np.int64)
        cols[:, 1] = np.fromiter(sizes, dtype=np.int64, count=n)
        has_exp = b[at] == 0xFC
        if has_exp.any():
            first = at[has_exp] + 1
            raw = b[first[:, None] + _BYTES8]  # the 8 little-endian bytes of each expiry, one row a key
            cols[has_exp, 2] = np.maximum(raw.view("<i8").ravel(), 0)  # signed, as `_record` reads it
            at = at + 9 * has_exp
        op = b[at]
        nxt = b[at + 1]
        is_idle, is_freq = op == 0xF8, op == 0xF9
        if is_idle.any():
            self.saw_idle = True
            short = is_idle & (nxt < 64)
            wide = is_idle & (nxt >= 64)
            cols[short, 3] = nxt[short]
            cols[wide, 3] = (nxt[wide].astype(np.int64) & 0x3F) << 8 | b[at[wide] + 2]
            at = at + np.where(short, 2, 0) + np.where(wide, 3, 0)
        if is_freq.any():
            self.saw_freq = True
            cols[is_freq, 3] = nxt[is_freq]
            at = at + 2 * is_freq
        cols[:, 0] = _TYPE_CODE_ARRAY[b[at]]
        return cols

    def _record(self, t: int, out: _Filling) -> int:
        """One record at ``pos`` (just after its type byte ``t``): a key/value (added to ``out``, with the
        pending ``expire`` / ``idle``) or an opcode. Returns `_EOF`, `_NEW_DB` or 0."""
        if t in TYPE_CODES:
            self._key_value(t, out, self.expire, self.idle)
            self.expire = self.idle = -1
        elif t == OP.EXPIRETIME_MS:
            self.expire = max(_I64.unpack(self.raw(8))[0], 0)  # before 1970: expired long ago (-1 means none)
        elif t == OP.IDLE:
            self.saw_idle = True
            self.idle = self.plain_length()
        elif t == OP.FREQ:
            self.saw_freq = True
            self.idle = self.byte()
        elif t == OP.SELECTDB:
            self.db = self.plain_length()
            if not out.keys:
                out.db = self.db
            return _NEW_DB
        elif t == OP.EOF:
            self.done = True
            self._check_sum()
            return _EOF
        else:
            handler = self._OPCODES.get(t)
            if handler is None:
                raise RdbError(f"unknown record type {t} (0x{t:02x}): not an RDB 9-12 value or opcode",
                               self.offset - 1)
            handler(self)
        return 0

    def _key_value(self, t: int, out: _Filling, expire: int, idle: int) -> None:
        start = self.offset - 1
        key = self.string()
        if t == 0:
            n, is_int = self.string_len()
            size = string_bytes(n, is_int)
        else:
            reader = _VALUE_READERS.get(t)
            if reader is None:
                raise RdbError(f"value type {t} is not readable (a pre-release module format)", start)
            size = reader(self)
        out.add_row(key, (TYPE_CODES[t], key_bytes(len(key)) + size, expire, idle))

    # ------------------------------------------------------------------ opcodes other than per-key ones
    def _check_sum(self) -> None:
        """After the EOF opcode: the 8 bytes of the CRC64 against every byte up to the opcode."""
        self.crc.fold(memoryview(self.buf)[:self.pos])
        self.crc.closed = True  # nothing after the opcode counts
        stored = self.buf[self.pos:self.pos + 8] if self._fill(8) else None
        self.checksum = self.crc.verdict(stored)
        if stored is not None:
            self.pos += 8

    def _aux(self) -> None:
        name = self.string().decode("utf-8", "replace")
        value = self.string().decode("utf-8", "replace")
        self.aux[name] = value[:200]

    def _resizedb(self) -> None:
        self.plain_length()
        self.plain_length()

    def _expire_s(self) -> None:  # EXPIRETIME in seconds: pre-RDB 9 writers only
        raise RdbError("an EXPIRETIME (seconds) record: written by Redis older than 5.0, not read", self.offset - 1)

    def _module_aux(self) -> None:
        self.plain_length()  # module id
        self.plain_length()  # when opcode
        self.plain_length()  # when
        self.module_opcodes()

    def _function(self) -> None:
        self.string_len()
        self.functions += 1

    def _function_pre_ga(self) -> None:
        raise RdbError("a pre-release function record (Redis 7.0 release candidates): not read", self.offset - 1)

    def _slot_info(self) -> None:
        for _ in range(3):
            self.plain_length()

    def module_opcodes(self) -> int:
        """Skip a module value in the v2 format: typed items until the EOF item. Returns bytes skipped."""
        start = self.offset
        while True:
            op = self.plain_length()
            if op == 0:  # EOF
                return self.offset - start
            if op in (1, 2):  # signed / unsigned integer
                self.plain_length()
            elif op == 3:  # float
                self.skip(4)
            elif op == 4:  # double
                self.skip(8)
            elif op == 5:  # string
                self.string_len()
            else:
                raise RdbError(f"unknown module value item {op}", self.offset)

    _OPCODES: ClassVar[dict[int, Callable[[RdbReader], None]]] = {
        OP.AUX: _aux, OP.RESIZEDB: _resizedb, OP.EXPIRETIME: _expire_s, OP.MODULE_AUX: _module_aux,
        OP.FUNCTION2: _function, OP.FUNCTION_PRE_GA: _function_pre_ga, OP.SLOT_INFO: _slot_info,
    }


# ---------------------------------------------------------------------- value readers: bytes estimated
def _list_linked(r: RdbReader) -> int:
    n = r.plain_length()
    total = 0
    for _ in range(n):
        total += sds(r.string_len()[0]) + _QL_NODE
    return blob_bytes(_QUICKLIST) + total


def _set_table(r: RdbReader) -> int:
    n = r.plain_length()
    total = 0
    for _ in range(n):
        total += sds(r.string_len()[0]) + 24
    return table_bytes(n, total)


def _hash_table(r: RdbReader) -> int:
    n = r.plain_length()
    total = 0
    for _ in range(n):
        total += sds(r.string_len()[0]) + sds(r.string_len()[0]) + 24
    return table_bytes(n, total)


def _hash_metadata(r: RdbReader, *, min_expire: bool) -> int:
    if min_expire:
        r.skip(8)
    n = r.plain_length()
    total = 0
    for _ in range(n):
        ttl = r.plain_length()
        total += sds(r.string_len()[0]) + sds(r.string_len()[0]) + 24 + (8 if ttl else 0)
    return table_bytes(n, total)


def _zset_table(r: RdbReader, *, binary_scores: bool) -> int:
    n = r.plain_length()
    total = 0
    for _ in range(n):
        total += sds(r.string_len()[0]) + 24 + _ZSET_NODE
        if binary_scores:
            r.skip(8)
        else:
            k = r.byte()
            if k < 253:
                r.skip(k)
    return table_bytes(n, total, extra=16 + 32 + je(32 + 32 * 16))  # zset, zskiplist, 32-level header node


def _blob(r: RdbReader) -> int:
    return blob_bytes(r.string_len()[0])


def _list_ziplist(r: RdbReader) -> int:
    return blob_bytes(_QUICKLIST) + _QL_NODE + je(r.string_len()[0])


def _hash_listpack_ex(r: RdbReader) -> int:
    r.skip(8)  # the smallest field expiry
    return blob_bytes(r.string_len()[0])


def _quicklist(r: RdbReader, *, containers: bool) -> int:
    nodes = r.plain_length()
    total = 0
    for _ in range(nodes):
        if containers:
            r.plain_length()  # 1: a plain node (one big element), 2: a listpack
        total += _QL_NODE + je(r.string_len()[0])
    return blob_bytes(_QUICKLIST) + total


def _stream(r: RdbReader, version: int) -> int:
    nodes = r.plain_length()
    total = 0
    for _ in range(nodes):
        r.string_len()  # the node's master ID (16 bytes)
        total += _RAX_NODE + je(max(r.string_len()[0], _STREAM_NODE_PREALLOC))
    for _ in range(3 if version == 1 else 8):  # length, last id (ms, seq) [, first id, max deleted id, added]
        r.plain_length()
    for _ in range(r.plain_length()):  # consumer groups
        total += 64 + sds(r.string_len()[0])
        r.plain_length()
        r.plain_length()  # last delivered id
        if version >= 2:
            r.plain_length()  # entries read
        pending = r.plain_length()
        for _ in range(pending):
            r.skip(16 + 8)  # raw id, delivery time
            r.plain_length()  # delivery count
        total += pending * _PEL_ENTRY
        for _ in range(r.plain_length()):  # consumers
            total += 48 + sds(r.string_len()[0])
            r.skip(8 if version < 3 else 16)  # seen time [, active time]
            own = r.plain_length()
            r.skip(16 * own)
            total += own * 24
    return blob_bytes(88) + total


def _module(r: RdbReader) -> int:
    r.plain_length()  # module id
    r.modules_skipped += 1
    return blob_bytes(r.module_opcodes())


def _module_pre_ga(r: RdbReader) -> int:
    raise RdbError("a pre-release module value (RDB type 6) cannot be skipped without its module", r.offset)


_VALUE_READERS: dict[int, Callable[[RdbReader], int]] = {
    1: _list_linked, 2: _set_table, 3: lambda r: _zset_table(r, binary_scores=False), 4: _hash_table,
    5: lambda r: _zset_table(r, binary_scores=True), 6: _module_pre_ga, 7: _module,
    9: _blob, 10: _list_ziplist, 11: _blob, 12: _blob, 13: _blob, 16: _blob, 17: _blob, 20: _blob, 23: _blob,
    14: lambda r: _quicklist(r, containers=False), 18: lambda r: _quicklist(r, containers=True),
    15: lambda r: _stream(r, 1), 19: lambda r: _stream(r, 2), 21: lambda r: _stream(r, 3),
    22: lambda r: _hash_metadata(r, min_expire=False), 24: lambda r: _hash_metadata(r, min_expire=True),
    25: _hash_listpack_ex,
}


#: sizes of short keys and string values by length (the inline path's lookups)
def _step_table(f: Callable[[int], int], n: int) -> list[int]:
    """``f(i)`` for i < n, for a non-decreasing ``f`` with few distinct values (jemalloc size classes): each
    run of equal values is found by bisection, so importing costs a few hundred calls, not ``n``."""
    out: list[int] = []
    while len(out) < n:
        lo, value = len(out), f(len(out))
        hi = n  # the first index past the run of ``value`` lies in (lo, hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if f(mid) == value:
                lo = mid
            else:
                hi = mid
        out += [value] * (hi - len(out))
    return out


_KEY_SIZE = [key_bytes(n) for n in range(64)]
_JE = _step_table(je, 1 << 14)
_STR_SIZE = _step_table(lambda n: string_bytes(n, False), 1 << 14)
_BLOB_SIZE = [ROBJ + x for x in _JE]
#: by type byte: the value-size table of the value types `_fast` reads as one string (strings, and the
#: single-blob encodings: listpack, ziplist, intset, zipmap of small hashes, sets and sorted sets), else None
_FAST_TABLES: list[list[int] | None] = [
    _STR_SIZE if t == 0 else _BLOB_SIZE if t in (9, 11, 12, 13, 16, 17, 20) else None for t in range(256)]
#: the type codes by type byte (-1: not a value type)
_TYPE_CODE_ARRAY = np.array([TYPE_CODES.get(t, -1) for t in range(256)], dtype=np.int64)
_BYTES8 = np.arange(8)


_QL_BASE = blob_bytes(_QUICKLIST)


def _inline_quicklist(buf: bytes, p: int, end: int) -> tuple[int, int]:
    """A quicklist 2 value (RDB type 18) at ``p`` whose node count, containers and listpack lengths are
    short and whose listpacks are stored raw or LZF: (estimated bytes, position after it), as `_quicklist`
    computes; (-1, p) for anything else (the general reader then reads it)."""
    nodes = buf[p]
    if nodes >= 64:
        return -1, p
    q = p + 1
    total = _QL_BASE
    for _ in range(nodes):
        if q + 8 > end or buf[q] >= 64:  # the container (1: plain, 2: packed), a 6-bit length
            return -1, p
        b = buf[q + 1]
        if b < 64:
            n, q = b, q + 2 + b
        elif b < 128:
            n = ((b & 0x3F) << 8) | buf[q + 2]
            q += 3 + n
        elif b == 0xC3:
            clen, r = _short_len(buf, q + 2)
            n, r = _short_len(buf, r) if clen >= 0 else (-1, r)
            if n < 0:
                return -1, p
            q = r + clen
        else:
            return -1, p
        total += _QL_NODE + (_JE[n] if n < 16384 else je(n))
    return total, q


def _short_len(buf: bytes, p: int) -> tuple[int, int]:
    """A 6- or 14-bit length at ``p``: (length, position after it), or (-1, p) for any other form."""
    b = buf[p]
    if b < 64:
        return b, p + 1
    if b < 128:
        return ((b & 0x3F) << 8) | buf[p + 1], p + 2
    return -1, p


def _inline_value(buf: bytes, p: int, str_size: list[int]) -> tuple[int, int]:
    """A string value at ``p`` in one of its common forms: (estimated bytes, position after it); (-1, p) for
    the rest (the caller then reads the record the general way). The position may lie past the buffer."""
    b = buf[p]
    if b < 64:
        return str_size[b], p + 1 + b
    if b < 128:
        n = ((b & 0x3F) << 8) | buf[p + 1]
        return str_size[n], p + 2 + n
    if b == 0xC3:  # LZF: compressed length, original length, data
        clen, q = _short_len(buf, p + 1)
        ulen, q = _short_len(buf, q) if clen >= 0 else (-1, q)
        if ulen < 0:
            return -1, p
        return str_size[ulen], q + clen
    if 0xC0 <= b <= 0xC2 and str_size is _STR_SIZE:  # an 8-, 16- or 32-bit integer (a string value only)
        return 16, p + 1 + (1 << (b & 3))
    return -1, p
