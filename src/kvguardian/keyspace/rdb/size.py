"""A key's memory, estimated from its serialized form the way ``MEMORY USAGE`` adds it up (Redis 7.x, jemalloc).

The key's ``dictEntry``, sds, value object and what the value points to, each rounded up to a jemalloc size
class; the RDB's encoding says which allocations the value had. Unlike ``MEMORY USAGE`` every element is
counted; tests/integration/keyspace/test_rdb.py compares the estimate with ``MEMORY USAGE SAMPLES 0``, type by
type. The per-encoding rules: docs/design/keyspace.md.
"""

from __future__ import annotations

__all__ = ["blob_bytes", "je", "key_bytes", "sds", "string_bytes", "table_bytes"]

DICT_ENTRY = 24
ROBJ = 16
DICT = 56  # struct dict, two tables (Redis 7.0)
EMBSTR_MAX = 44


def je(n: int) -> int:
    """``n`` rounded up to a jemalloc size class (8, 16, then 16-byte steps to 128, then four per doubling)."""
    if n <= 8:
        return 8
    if n <= 128:
        return (n + 15) & ~15
    step = 1 << ((n - 1).bit_length() - 3)
    return (n + step - 1) & ~(step - 1)


def sds(n: int) -> int:
    """The allocation of an sds string of ``n`` bytes (header by length class, data, terminating NUL)."""
    hdr = 1 if n < 32 else 3 if n < 256 else 5 if n < 65536 else 9
    return je(hdr + n + 1)


def key_bytes(key_len: int) -> int:
    """The key's share: its dictEntry and its sds."""
    return DICT_ENTRY + sds(key_len)


def string_bytes(n: int, is_int: bool) -> int:
    """A string value of ``n`` bytes (``is_int``: saved with an integer encoding)."""
    if is_int:
        return ROBJ
    if n <= EMBSTR_MAX:
        return je(ROBJ + 3 + n + 1)
    return ROBJ + sds(n)


def blob_bytes(n: int) -> int:
    """A value held as one listpack / ziplist / intset of ``n`` bytes."""
    return ROBJ + je(n)


def table_bytes(entries: int, element_bytes: int, extra: int = 0) -> int:
    """A hash-table encoded value: the object, the dict, the bucket array, ``element_bytes`` summed over the
    elements (their sds strings, entries and nodes), and ``extra``."""
    slots = 1 << max(2, (entries - 1).bit_length()) if entries else 0
    return ROBJ + DICT + 8 * slots + element_bytes + extra
