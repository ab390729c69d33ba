"""The engine loop: an `Engine` run as a server runs it. Requests arrive at any time from any thread; one
thread steps the engine.

    loop = EngineLoop(engine).start()
    seq = loop.submit(Request("r-1", "acme", prompt, 16)).result()         # wait for the whole answer
    loop.abort("r-1")                                                       # the client went away

`submit` returns a Future of the request's `Sequence` (an optional callback streams tokens, on the engine
thread). Between steps the thread admits arrivals and drops aborted requests; a step that raises fails the
requests in flight and the loop serves on. Others touch the pool only under `lock`. Details:
docs/design/paged.md.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from kvguardian.core.errors import UsageError
from kvguardian.runtime.paged.engine import Engine, Request, Sequence

__all__ = ["EngineLoop", "LoopStats", "Stopped", "TokenCallback"]

log = logging.getLogger("kvguardian")


@dataclass(frozen=True)
class Stopped:
    """Why a request ended without finishing: ``shed`` (memory pressure; retry later), ``aborted`` (the
    client went away) or ``failed`` (the engine failed it, or the loop closed)."""

    reason: Literal["shed", "aborted", "failed"]
    message: str

    def __str__(self) -> str:
        return self.message


#: ``callback(token, finished, stopped)``: a new token (None when stopped), whether the request is done.
TokenCallback = Callable[[int | None, bool, Stopped | None], None]


@dataclass(eq=False)
class _Entry:
    request: Request
    callback: TokenCallback | None
    future: Future[Sequence] = field(default_factory=Future)
    seq: Sequence | None = None  # set when the engine takes it
    sent: int = 0  # tokens handed to the callback
    aborted: bool = False


@dataclass
class LoopStats:
    steps: int = 0
    requests: int = 0
    aborted: int = 0
    failed: int = 0
    shed: int = 0
    errors: list[str] = field(default_factory=list)  # the last step failures, at most 16


class EngineLoop:
    """Steps ``engine`` in a daemon thread; `start` it, `submit` requests, `abort` them, `close` it.
    ``on_step`` runs on the engine thread after every turn of the loop (e.g. to feed a ledger)."""

    def __init__(self, engine: Engine, *, on_step: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.lock = engine.lock  # held while the pool's tables change (the engine's own lock)
        self.stats = LoopStats()
        self.error: BaseException | None = None  # what stopped the loop, if anything did
        self._cv = threading.Condition()
        self._inbox: deque[_Entry] = deque()
        self._entries: dict[str, _Entry] = {}  # in the engine
        self._closed = False
        self._on_step = on_step
        self._thread = threading.Thread(target=self._run, name="kvguardian-engine", daemon=True)

    def start(self) -> EngineLoop:
        """Start the thread (idempotent; a closed loop stays closed)."""
        with self._cv:
            if not self._thread.is_alive() and not self._closed:
                self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread; requests still in flight fail ("the server is shutting down")."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with self._cv:
            pending = list(self._inbox)
            self._inbox.clear()
        for entry in pending:  # arrived after the thread's last turn
            _end(entry, Stopped("failed", "the server is shutting down"))

    def submit(self, request: Request, callback: TokenCallback | None = None) -> Future[Sequence]:
        """Queue ``request``; see the module's docstring for what the future and ``callback`` receive."""
        entry = _Entry(request, callback)
        with self._cv:
            stopped = self._closed or self.error is not None
            if not stopped:
                self._inbox.append(entry)
                self._cv.notify_all()
        if stopped:
            why = f"the engine loop stopped: {self.error!r}" if self.error is not None else "the engine loop is closed"
            _end(entry, Stopped("failed", why))
        return entry.future

    def abort(self, request_id: str) -> None:
        """Stop generating for ``request_id`` (a client that disconnected); its blocks are freed before the
        next step."""
        with self._cv:
            entry = self._entries.get(request_id)
            if entry is not None:
                entry.aborted = True
            for e in self._inbox:
                if e.request.request_id == request_id:
                    e.aborted = True
            self._cv.notify_all()

    def snapshot(self) -> dict[str, Any]:
        s, e = self.stats, self.engine
        return {"steps": s.steps, "requests": s.requests, "aborted": s.aborted, "failed": s.failed, "shed": s.shed,
                "preemptions": e.preemptions, "running": len(e.running), "waiting": len(e.waiting)}

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # not an Exception: stop stepping, tell every waiting client
            self.error = exc
            self._fail_all(f"the engine loop stopped: {type(exc).__name__}")
            raise
        self._fail_all("the server is shutting down")

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._inbox and not self.engine.has_work:
                    self._cv.wait(0.5)
                if self._closed:
                    return
                arrivals = list(self._inbox)
                self._inbox.clear()
            self._admit(arrivals)
            self._drop_aborted()
            if self.engine.has_work:
                self._step()
            if self._on_step is not None:
                self._on_step()

    def _admit(self, arrivals: list[_Entry]) -> None:
        for entry in arrivals:
            if entry.aborted:
                _end(entry, Stopped("aborted", "aborted"))
                self.stats.aborted += 1
                continue
            try:
                entry.seq = self.engine.submit(entry.request)
            except UsageError as exc:  # a request id already in the engine: that request's error only
                _end(entry, Stopped("failed", str(exc)))
                self.stats.failed += 1
                continue
            self._entries[entry.request.request_id] = entry
            self.stats.requests += 1

    def _step(self) -> None:
        try:
            ended = self.engine.step()
        except Exception as exc:  # a bug or a request the pool cannot hold: fail what is in flight, go on
            log.warning("engine step failed: %s: %s", type(exc).__name__, exc)
            self.stats.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            del self.stats.errors[:-16]
            self._fail_all("the engine failed this request")
            return
        self.stats.steps += 1
        for entry in list(self._entries.values()):  # new tokens since the last step, in order
            _stream(entry)
        for seq in ended:
            done = self._entries.pop(seq.rid, None)
            if done is None:
                continue
            if seq.error is not None:  # shed under memory pressure
                self.stats.shed += 1
                _end(done, Stopped("shed", seq.error))
            else:
                done.future.set_result(seq)

    def _drop_aborted(self) -> None:
        with self._cv:
            gone = [e for e in self._entries.values() if e.aborted]
        for entry in gone:
            self.engine.abort(entry.request.request_id)
            del self._entries[entry.request.request_id]
            self.stats.aborted += 1
            _end(entry, Stopped("aborted", "aborted"))

    def _fail_all(self, why: str) -> None:
        for entry in list(self._entries.values()):
            try:
                self.engine.abort(entry.request.request_id)
            except Exception as exc:  # keep failing the others
                log.warning("cannot free %s: %s", entry.request.request_id, exc)
            self.stats.failed += 1
            _end(entry, Stopped("failed", why))
        self._entries.clear()


def _stream(entry: _Entry) -> None:
    seq = entry.seq
    assert seq is not None
    while entry.sent < len(seq.output):
        entry.sent += 1
        last = entry.sent == len(seq.output) and seq.finished and seq.error is None
        _call(entry, seq.output[entry.sent - 1], last, None)


def _end(entry: _Entry, stopped: Stopped) -> None:
    """End ``entry`` early: its callback hears why, its future is cancelled (aborted), resolves to the shed
    sequence, or fails."""
    _call(entry, None, True, stopped)
    fut = entry.future
    if stopped.reason == "aborted":
        fut.cancel()
    elif stopped.reason == "shed" and entry.seq is not None:
        fut.set_result(entry.seq)
    else:
        fut.set_exception(RuntimeError(stopped.message))


def _call(entry: _Entry, token: int | None, finished: bool, stopped: Stopped | None) -> None:
    if entry.callback is None:
        return
    try:
        entry.callback(token, finished, stopped)
    except Exception as exc:  # a handler's problem never stops the engine
        log.debug("token callback failed: %s", exc)
