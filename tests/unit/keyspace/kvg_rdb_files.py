"""Hand-built RDB files for the reader's unit tests: lengths, strings, AUX fields and a whole file around records.

Test files import these as ``kvg_rdb_files`` (pytest puts this folder on sys.path).
"""

from __future__ import annotations


def ln(n: int) -> bytes:
    if n < 64:
        return bytes([n])
    if n < 16384:
        return bytes([0x40 | (n >> 8), n & 0xFF])
    if n < 2**32:
        return b"\x80" + n.to_bytes(4, "big")
    return b"\x81" + n.to_bytes(8, "big")


def st(b: bytes | str) -> bytes:
    b = b.encode() if isinstance(b, str) else b
    return ln(len(b)) + b


def rdb(*records: bytes, version: int = 12) -> bytes:
    return b"REDIS%04d" % version + st_aux("redis-ver", "7.4.0") + b"\xfe\x00\xfb\x02\x00" + b"".join(records) \
        + b"\xff" + bytes(8)


def st_aux(k: str, v: str) -> bytes:
    return b"\xfa" + st(k) + st(v)
