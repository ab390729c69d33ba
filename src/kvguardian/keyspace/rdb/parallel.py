"""The RDB reader in a child process: parsing and mining overlap on two cores.

Reading a key and mining it cost about the same, so a forked child runs `RdbReader` and sends batches (key
names pickled, the numbers as one raw int64 buffer) through a pipe while the parent mines the previous one.
The child inherits the open stream through ``fork``; without ``fork`` the caller reads in-process. Reader state
and an `RdbError` travel with the batches, so errors surface as in-process. Measurements:
docs/design/keyspace.md.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from kvguardian.keyspace.rdb.format import RdbError
from kvguardian.keyspace.rdb.reader import Batch, ByteStream, RdbReader

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

__all__ = ["ReaderProcess", "can_fork", "worth_forking"]


def can_fork() -> bool:
    return "fork" in mp.get_all_start_methods()


def _state(r: RdbReader) -> dict[str, Any]:
    return {"aux": r.aux, "version": r.version, "saw_idle": r.saw_idle, "saw_freq": r.saw_freq,
            "modules_skipped": r.modules_skipped, "functions": r.functions, "done": r.done, "offset": r.offset,
            "checksum": r.checksum}


def _child(reader: RdbReader, conn: Connection) -> None:
    try:
        for b in reader.batches():
            conn.send_bytes(pickle.dumps(("batch", (b.keys, b.cols.tobytes(), b.db), _state(reader)),
                                         protocol=pickle.HIGHEST_PROTOCOL))
        conn.send_bytes(pickle.dumps(("end", None, _state(reader))))
    except RdbError as exc:
        conn.send_bytes(pickle.dumps(("error", (str(exc), exc.offset), _state(reader))))
    except BaseException as exc:  # anything else: the parent says so in one line
        conn.send_bytes(pickle.dumps(("error", (f"reader process failed: {type(exc).__name__}: {exc}", -1),
                                      _state(reader))))
    finally:
        conn.close()


class ReaderProcess:
    """`RdbReader`'s interface (``batches``, ``aux``, ``version``, ...) over a forked child that reads."""

    def __init__(self, reader: RdbReader) -> None:
        self._reader = reader  # header already read: version known, the child goes on from there
        self.aux: dict[str, str] = dict(reader.aux)
        self.version = reader.version
        self.saw_idle = self.saw_freq = False
        self.modules_skipped = self.functions = 0
        self.done = False
        self.checksum = reader.checksum
        self.offset = reader.offset

    @classmethod
    def open(cls, stream: ByteStream, *, limit: int | None = None) -> ReaderProcess:
        reader = RdbReader(stream, limit=limit)
        reader.header()
        return cls(reader)

    def _update(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def batches(self) -> Iterator[Batch]:
        ctx = mp.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child, args=(self._reader, send), name="kvguardian-rdb-reader", daemon=True)
        child.start()
        send.close()
        try:
            yield from self._receive(recv)
        finally:
            recv.close()
            if child.is_alive():
                child.terminate()  # a stop or an error in the parent: the child we started, by its handle
            child.join(5)

    def _receive(self, recv: Connection) -> Iterator[Batch]:
        while True:
            try:
                kind, payload, state = pickle.loads(recv.recv_bytes())
            except EOFError:
                raise RdbError("the reader process ended without a result", self.offset) from None
            self._update(state)
            if kind == "batch":
                keys, cols, db = payload
                # raw bytes, not a pickled array: an unpickled array carries its own dtype object, which
                # sends numpy's ufunc.at (the statistics) down its slow buffered path (docs/design/keyspace.md)
                yield Batch(keys, np.frombuffer(cols, dtype=np.int64).reshape(-1, 4), db)
            elif kind == "error":
                message, offset = payload
                raise RdbError(message, offset if offset >= 0 else self.offset)
            else:
                return


def worth_forking(stream: Any) -> bool:
    """A real file or socket (a descriptor the child can read), and more than one core."""
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return can_fork() and (os.cpu_count() or 1) > 1
