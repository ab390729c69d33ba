"""Run an `Engine` as a server runs it: requests arrive at any time from any thread, one loop steps.

    loop = EngineLoop(engine).start()
    seq = loop.submit(Request("r-1", "acme", prompt, 16)).result()   # a concurrent.futures.Future
    loop.stop()

The loop thread is the only one that steps the engine. A step that raises fails the futures of the
requests in the engine (their blocks stay as they were: the error is the engine's, not the client's).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from kvguardian.paged.engine import Engine, Request, Sequence

__all__ = ["EngineLoop"]


class EngineLoop:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._futures: dict[str, Future[Sequence]] = {}
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> EngineLoop:
        self._thread = threading.Thread(target=self._run, name="kvguardian-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def submit(self, req: Request) -> Future[Sequence]:
        """Queue ``req``; the future resolves to its `Sequence` when it ends (``seq.error`` set if shed)."""
        fut: Future[Sequence] = Future()
        with self._wake:
            if self.error is not None:
                fut.set_exception(RuntimeError(f"the engine loop stopped: {self.error!r}"))
                return fut
            self.engine.submit(req)
            self._futures[req.request_id] = fut
            self._wake.notify_all()
        return fut

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._wake:
                while not self._stop and not engine.has_work:
                    self._wake.wait(0.5)
                if self._stop:
                    return
            try:
                ended = engine.step()
            except BaseException as exc:  # the engine failed: tell every waiting client, stop stepping
                self._fail(exc)
                return
            if ended:
                with self._wake:
                    futs = [(seq, self._futures.pop(seq.rid, None)) for seq in ended]
                for seq, fut in futs:
                    if fut is not None:
                        fut.set_result(seq)

    def _fail(self, exc: BaseException) -> None:
        with self._wake:
            self.error = exc
            futs, self._futures = list(self._futures.values()), {}
        for fut in futs:
            fut.set_exception(exc)
