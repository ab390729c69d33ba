"""The RDB format as Redis 5.0-8.x writes it (RDB versions 9-12): opcodes, value types, encodings.

A file is ``REDIS`` + four version digits, then records introduced by an opcode (>= 0xF4) or a value type,
with per-key opcodes (expiry, ``IDLE``, ``FREQ``) before their key, and ``EOF`` + CRC64 at the end. Lengths and
special string encodings are summarised in docs/design/keyspace.md.
"""

from __future__ import annotations

__all__ = ["OP", "TYPE_CODES", "TYPE_NAMES", "RdbError"]

from kvguardian.core.errors import UsageError


class RdbError(UsageError):
    """The file is not an RDB this reader understands, or it is damaged; ``offset`` is where, in bytes."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class OP:
    """Opcodes (the record types that are not key/value pairs)."""

    KEY_META = 0xF3  # newer than RDB 12: not read
    SLOT_INFO = 0xF4  # Redis 7.4+ cluster: slot id, slot size, expires slot size (three lengths)
    FUNCTION2 = 0xF5  # a function library: one string
    FUNCTION_PRE_GA = 0xF6  # 7.0 release candidates only: not readable
    MODULE_AUX = 0xF7  # module data outside the key space: module id, when opcode, when, module value
    IDLE = 0xF8
    FREQ = 0xF9
    AUX = 0xFA  # two strings: name, value (redis-ver, ctime, used-mem, ...)
    RESIZEDB = 0xFB  # two lengths: keys and keys with an expiry in the selected db
    EXPIRETIME_MS = 0xFC
    EXPIRETIME = 0xFD
    SELECTDB = 0xFE
    EOF = 0xFF


#: RDB value type -> the name `TYPE` reports
TYPE_NAMES = {
    0: "string", 1: "list", 2: "set", 3: "zset", 4: "hash", 5: "zset", 6: "module", 7: "module",
    9: "hash", 10: "list", 11: "set", 12: "zset", 13: "hash", 14: "list", 15: "stream", 16: "hash",
    17: "zset", 18: "list", 19: "stream", 20: "set", 21: "stream", 22: "hash", 23: "hash", 24: "hash", 25: "hash",
}

_CODE = {"string": 0, "list": 1, "set": 2, "zset": 3, "hash": 4, "stream": 5, "module": 6}
#: RDB value type -> the type code of `kvguardian.keyspace.stats.TYPES`
TYPE_CODES = {t: _CODE[name] for t, name in TYPE_NAMES.items()}

#: versions this reader was written for (9: Redis 5.0, 10: 7.0, 11: 7.2, 12: 7.4 and 8.x)
VERSIONS = range(9, 13)
