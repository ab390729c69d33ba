"""A key's memory, estimated from its serialized form the way ``MEMORY USAGE`` adds it up (Redis 7.x, jemalloc).

``MEMORY USAGE`` is the key's ``dictEntry`` (24 bytes) + the key's sds + the value object (16 bytes) + what
the value points to, each allocation rounded up to a jemalloc size class (four classes per doubling). The
RDB says which encoding the value had when it was saved, so each part can be rebuilt:

- strings: an integer (RDB integer encoding) lives in the object itself; up to 44 bytes the object and its
  sds are one allocation ("embstr"); longer ones are a separate sds;
- listpack / ziplist / intset encodings (small hashes, sets, sorted sets, list nodes, stream nodes) are
  stored in the RDB byte for byte as they are in memory: the blob's length is the allocation;
- hash tables (large sets and hashes) add a bucket array (8 bytes a slot, slots a power of two) and per
  element a 24-byte ``dictEntry`` and an sds per string; skiplist sorted sets add a ~48-byte node per member;
- quicklists add a 32-byte node per listpack; streams a radix-tree node (~48 bytes) per listpack and
  ~48 bytes per pending entry, and a server that appended the entries allocated each node's listpack 4 KiB
  up front (a server that loaded them from this file holds the exact size: the estimate is the former).

Unlike ``MEMORY USAGE`` (which samples 5 elements of a collection unless told ``SAMPLES 0``), every element
is counted. tests/integration/keyspace/test_rdb.py compares the estimate with ``MEMORY USAGE SAMPLES 0`` of
the server that wrote the file, type by type.
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
