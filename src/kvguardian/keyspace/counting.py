"""Where a scan's client work runs: pattern mining and per-pattern statistics, in this process or in a forked
child at a lower CPU priority.

A scan's throughput is set by how fast a reply becomes the next request, so a reniced requester crawls on a
busy host. By default the requests go out at the caller's priority and only the mining and counting (nearly
all of the client's CPU) run reniced in a forked child (a thread would share the GIL), fed through a pipe
whose back-pressure keeps memory bounded. `Counting` is the interface the scan uses. Measurements:
docs/design/keyspace.md.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kvguardian.keyspace.pacing import lower_priority

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

__all__ = ["Counting", "InProcess", "MinerProcess", "can_fork"]

#: what a scan's counting gives back: (pattern rows, keys that vanished between SCAN and probe)
Outcome = tuple[list[dict[str, Any]], int]


class Counting(Protocol):
    def add(self, keys: list[bytes], probe: np.ndarray) -> None: ...

    def finish(self) -> Outcome: ...

    def close(self) -> None: ...


class Batches(Protocol):
    """The counting itself (`kvguardian.keyspace.scan` builds it): takes batches, gives the outcome."""

    def add(self, keys: list[bytes], probe: np.ndarray) -> None: ...

    def outcome(self) -> Outcome: ...


def can_fork() -> bool:
    return "fork" in mp.get_all_start_methods()


class InProcess:
    """Counting in the calling thread."""

    def __init__(self, make: Callable[[], Batches]) -> None:
        self.work = make()

    def add(self, keys: list[bytes], probe: np.ndarray) -> None:
        self.work.add(keys, probe)

    def finish(self) -> Outcome:
        return self.work.outcome()

    def close(self) -> None:
        pass


def _child(make: Callable[[], Batches], nice: int, conn: Connection) -> None:
    # a terminal's Ctrl-C or hang-up reaches the whole process group: the scan decides how to end (a partial
    # result), and this child ends when its pipe closes (SIGTERM, sent to one process, still ends it)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    lower_priority(nice)
    work = make()
    try:
        while True:
            msg = conn.recv_bytes()
            if msg == b"end":
                break
            keys, raw, n = pickle.loads(msg)
            work.add(keys, np.frombuffer(raw, dtype=np.int64).reshape(n, 4))
        conn.send_bytes(pickle.dumps(("ok", work.outcome()), protocol=pickle.HIGHEST_PROTOCOL))
    except EOFError:  # the scan went away: nothing to report to
        pass
    except BaseException as exc:  # the parent says so in one line
        conn.send_bytes(pickle.dumps(("error", f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()


class MinerProcess:
    """Counting in a forked child reniced by ``nice``; `finish` waits for its outcome."""

    def __init__(self, make: Callable[[], Batches], nice: int) -> None:
        ctx = mp.get_context("fork")
        self._conn, child_end = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=_child, args=(make, nice, child_end), name="kvguardian-scan-mining",
                                 daemon=True)
        self._proc.start()
        child_end.close()

    def add(self, keys: list[bytes], probe: np.ndarray) -> None:
        probe = np.ascontiguousarray(probe, dtype=np.int64)
        self._conn.send_bytes(pickle.dumps((keys, probe.tobytes(), len(probe)), protocol=pickle.HIGHEST_PROTOCOL))

    def finish(self) -> Outcome:
        from kvguardian.core.errors import KVGuardianError

        try:
            self._conn.send_bytes(b"end")
            kind, payload = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise KVGuardianError(f"the scan's mining process ended early ({type(exc).__name__})") from None
        if kind != "ok":
            raise KVGuardianError(f"the scan's mining process failed: {payload}")
        return payload  # type: ignore[no-any-return]

    def close(self) -> None:
        """End the child (it is ours, by its handle) if it is still there."""
        self._conn.close()  # the child sees EOF and exits
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
