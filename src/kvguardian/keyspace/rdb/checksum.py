"""The RDB file's trailing CRC64 (Redis's crc64: the Jones polynomial, reflected, as ``redis-check-rdb``
checks it), computed as the reader consumes the file.

The checksum covers every byte from the ``REDIS`` magic to the EOF opcode; the 8 bytes after that opcode
hold it, little-endian, or zeros when the server saved with ``rdbchecksum no``. A damaged byte inside a
string or a length the reader cannot tell from a good one is caught only here. The arithmetic runs in C
through ``anycrc`` (part of the ``redis`` extra; docs/design/keyspace.md); without it the file is read unchecked
and the result says so.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Crc64", "Verdict"]


class Verdict:
    """What the check found (a string each, as it appears in results)."""

    OK = "ok"
    MISMATCH = "mismatch"
    NONE = "none"  # saved without a checksum (rdbchecksum no): 8 zero bytes
    UNCHECKED = "unchecked"  # anycrc is not installed
    UNREAD = "unread"  # the file ended before its checksum


def _model() -> Any:
    try:
        import anycrc
    except ImportError:
        return None
    return anycrc.Model("CRC64-REDIS")


class Crc64:
    """A running CRC64 over the bytes folded in, in order (``value`` is None where anycrc is missing)."""

    __slots__ = ("_model", "closed", "value")

    def __init__(self) -> None:
        self._model = _model()
        self.value: int | None = 0 if self._model is not None else None
        self.closed = False  # the checksummed bytes are all folded in: later folds are ignored

    def fold(self, data: bytes | memoryview) -> None:
        if self._model is not None and not self.closed and len(data):
            self.value = self._model.calc(data, self.value)

    def verdict(self, stored: bytes | None) -> str:
        """Compare with the 8 stored bytes (None: the file ended before them)."""
        if stored is None or len(stored) < 8:
            return Verdict.UNREAD
        if stored == bytes(8):
            return Verdict.NONE
        if self.value is None:
            return Verdict.UNCHECKED
        return Verdict.OK if int.from_bytes(stored, "little") == self.value else Verdict.MISMATCH
