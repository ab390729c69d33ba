"""How long-running commands end on a signal: SIGINT (Ctrl-C), SIGTERM (a supervisor, ``docker stop``,
Kubernetes) and SIGHUP all end them the same way, keeping what was computed.

- `interrupting`: a command that computes one result (``redis scan``) gets ``KeyboardInterrupt`` for each of
  them, exactly as for Ctrl-C, keeps its partial result, and exits with ``128 + signal``;
- `stopping`: a command that loops until told (``watch``, the exporters) gets a stop callback instead, run in
  a short-lived thread (never inside the handler: see `stopping`).

Handlers are only installed from the main thread (elsewhere a command runs as a library call) and are
restored afterwards.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

__all__ = ["ENDING", "Ending", "interrupting", "stopping"]

#: The signals that end a long-running command.
ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Ending:
    """The signal that ended the command, if one did."""

    signum: int | None = None

    @property
    def exit_code(self) -> int:
        """``128 + signal`` (130 for Ctrl-C, 143 for SIGTERM)."""
        return 128 + (self.signum or signal.SIGINT)


@contextmanager
def _handlers(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in ENDING:
        if signal.getsignal(sig) != signal.SIG_IGN:  # an ignored signal (nohup) stays ignored
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def interrupting() -> Iterator[Ending]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise ``KeyboardInterrupt``; the `Ending` says which."""
    ending = Ending()

    def handler(signum: int, frame: FrameType | None) -> None:
        if ending.signum is None:
            ending.signum = signum
        raise KeyboardInterrupt

    with _handlers(handler):
        yield ending


@contextmanager
def stopping(stop: Callable[[], None]) -> Iterator[Ending]:
    """Within the block, SIGINT, SIGTERM and SIGHUP call ``stop()``; the `Ending` says which came first."""
    ending = Ending()

    def handler(signum: int, frame: FrameType | None) -> None:
        if ending.signum is None:
            ending.signum = signum
        # not called here: the handler runs in the main thread between two bytecodes, possibly while that thread
        # holds the very lock ``stop`` takes (inside ``Event.wait``, whose condition lock ``Event.set`` needs):
        # called inline, a Ctrl-C at that instant deadlocked the watch
        threading.Thread(target=stop, name="kvguardian-stop", daemon=True).start()

    with _handlers(handler):
        yield ending
