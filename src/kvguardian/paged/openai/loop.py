"""The mini engine as a server runs it: one thread steps the engine while requests arrive and leave.

HTTP handlers `submit` a request with a callback and `abort` it when the client goes away; the thread moves
arrivals into the engine's waiting queue between steps, runs `Engine.step`, and calls each scheduled
request's callback with its new token (from the engine thread: a callback must only hand the token over,
e.g. with ``loop.call_soon_threadsafe``). Aborted and failed requests give their blocks back at once. The
pool is only touched by this thread, or by others under `lock` (metrics scrapes).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvguardian.paged.engine import Engine, Request, Sequence

__all__ = ["EngineLoop", "TokenCallback"]

log = logging.getLogger("kvguardian")

#: ``callback(token, finished, error)``: a new token (None with an error), whether the request is done.
TokenCallback = Callable[[int | None, bool, str | None], None]


@dataclass
class _Entry:
    request: Request
    callback: TokenCallback
    seq: Sequence | None = None  # set when the engine takes it
    sent: int = 0  # tokens handed to the callback
    aborted: bool = False


@dataclass
class LoopStats:
    steps: int = 0
    requests: int = 0
    aborted: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


class EngineLoop:
    """Steps ``engine`` in a daemon thread, streaming each request's tokens to its callback; `start` it,
    `submit` requests, `abort` them, `close` it. (`kvguardian.paged.serve.EngineLoop` resolves one future
    per request instead: no streaming, no abort.)"""

    def __init__(self, engine: Engine, *, on_step: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.lock = engine.lock  # held while the pool's tables change (the engine's own lock)
        self.stats = LoopStats()
        self._cv = threading.Condition()
        self._inbox: deque[_Entry] = deque()
        self._entries: dict[str, _Entry] = {}
        self._stop = False
        self._on_step = on_step
        self._thread = threading.Thread(target=self._run, name="kvguardian-mini-engine", daemon=True)

    def start(self) -> EngineLoop:
        """Start the thread (idempotent; a closed loop stays closed)."""
        with self._cv:
            if not self._thread.is_alive() and not self._stop:
                self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, request: Request, callback: TokenCallback) -> None:
        with self._cv:
            self._inbox.append(_Entry(request, callback))
            self._cv.notify()

    def abort(self, request_id: str) -> None:
        """Stop generating for ``request_id`` (a client that disconnected); its blocks are freed next step."""
        with self._cv:
            entry = self._entries.get(request_id)
            if entry is not None:
                entry.aborted = True
            for e in self._inbox:
                if e.request.request_id == request_id:
                    e.aborted = True
            self._cv.notify()

    def snapshot(self) -> dict[str, Any]:
        s, e = self.stats, self.engine
        return {"steps": s.steps, "requests": s.requests, "aborted": s.aborted, "failed": s.failed,
                "preemptions": e.preemptions, "running": len(e.running), "waiting": len(e.waiting)}

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._inbox and not self.engine.has_work:
                    self._cv.wait()
                if self._stop:
                    break
                arrivals = list(self._inbox)
                self._inbox.clear()
            self._admit(arrivals)
            self._drop_aborted()
            if self.engine.has_work:
                self._step()
            if self._on_step is not None:
                self._on_step()
        with self.lock:
            self._fail_all("the server is shutting down")

    def _admit(self, arrivals: list[_Entry]) -> None:
        for entry in arrivals:
            if entry.aborted:
                continue
            entry.seq = self.engine.submit(entry.request)
            self._entries[entry.request.request_id] = entry
            self.stats.requests += 1

    def _step(self) -> None:
        try:
            ended = self.engine.step()
        except Exception as exc:  # a bug or a request the pool cannot hold: fail what is in flight, go on
            log.warning("mini engine step failed: %s: %s", type(exc).__name__, exc)
            self.stats.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            del self.stats.errors[:-16]
            with self.lock:
                self._fail_all("the engine failed this request")
            return
        self.stats.steps += 1
        for entry in list(self._entries.values()):  # new tokens since the last step, in order
            seq = entry.seq
            assert seq is not None
            while entry.sent < len(seq.output):
                last = entry.sent == len(seq.output) - 1 and seq.finished
                entry.sent += 1
                _call(entry, seq.output[entry.sent - 1], last and seq.error is None, None)
        for seq in ended:
            gone = self._entries.pop(seq.rid, None) if seq.rid in self._entries else None
            if gone is not None and seq.error is not None:  # shed under memory pressure
                self.stats.failed += 1
                _call(gone, None, True, seq.error)

    def _drop_aborted(self) -> None:
        gone = [e for e in self._entries.values() if e.aborted]
        if not gone:
            return
        with self.lock:
            for entry in gone:
                assert entry.seq is not None
                self._release(entry.seq)
                self.stats.aborted += 1
                self._entries.pop(entry.request.request_id, None)
                _call(entry, None, True, "aborted")

    def _release(self, seq: Sequence) -> None:
        engine = self.engine
        if seq in engine.running:
            engine.running.remove(seq)
        elif seq in engine.waiting:
            engine.waiting.remove(seq)
        if engine.pool.has_table(seq.rid):
            engine.pool.free(seq.rid)

    def _fail_all(self, why: str) -> None:
        for entry in list(self._entries.values()):
            if entry.seq is not None:
                try:
                    self._release(entry.seq)
                except Exception as exc:  # keep failing the others
                    log.warning("cannot free %s: %s", entry.request.request_id, exc)
            self.stats.failed += 1
            _call(entry, None, True, why)
        self._entries.clear()


def _call(entry: _Entry, token: int | None, finished: bool, error: str | None) -> None:
    try:
        entry.callback(token, finished, error)
    except Exception as exc:  # a handler's problem never stops the engine
        log.debug("token callback failed: %s", exc)
