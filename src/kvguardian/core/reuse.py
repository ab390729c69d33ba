"""Cross-request KV reuse rate over a sliding window, by count (the last N requests) and by time (the last
T seconds). A request counts when it used at least one cache; it is a *hit* when it started from KV that an
earlier request (or a copy of an earlier cache) had already filled.

Pure Python, bounded: one small tuple per request, at most ``capacity`` kept.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from kvguardian.core.errors import UsageError

__all__ = ["ReuseWindow"]


class ReuseWindow:
    """Samples ``(time, hit, reused tokens, newly prefilled tokens)``, one per request end."""

    def __init__(self, capacity: int = 4_096, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise UsageError(f"ReuseWindow capacity must be >= 1, got {capacity}")
        self._samples: deque[tuple[float, bool, int, int]] = deque(maxlen=capacity)
        self._clock = clock
        self._lock = threading.Lock()
        self.total_requests = 0
        self.total_hits = 0

    def add(self, hit: bool, reused_tokens: int, prefill_tokens: int, ts: float | None = None) -> None:
        with self._lock:
            self._samples.append((self._clock() if ts is None else ts, hit, reused_tokens, prefill_tokens))
            self.total_requests += 1
            self.total_hits += int(hit)

    def rate(self, *, last: int | None = None, seconds: float | None = None) -> dict[str, Any]:
        """The reuse rate over the last ``last`` requests, or those that ended in the last ``seconds``.

        Returns ``requests`` (in the window), ``hits``, ``hit_rate`` (hits / requests, None when empty) and
        ``token_reuse_rate`` (reused tokens / all tokens the requests started from, None when empty).
        """
        if (last is None) == (seconds is None):
            raise UsageError("ReuseWindow.rate() takes exactly one of last=N or seconds=T")
        if last is not None and last < 1:
            raise UsageError(f"reuse window last={last} must be >= 1")
        if seconds is not None and seconds <= 0:
            raise UsageError(f"reuse window seconds={seconds} must be > 0")
        with self._lock:
            if last is not None:
                window = list(self._samples)[-last:]
            else:
                assert seconds is not None
                cutoff = self._clock() - seconds
                window = [s for s in self._samples if s[0] >= cutoff]
        n = len(window)
        hits = sum(1 for s in window if s[1])
        reused = sum(s[2] for s in window)
        tokens = reused + sum(s[3] for s in window)
        out: dict[str, Any] = {"requests": n, "hits": hits,
                               "hit_rate": round(hits / n, 6) if n else None,
                               "reused_tokens": reused,
                               "token_reuse_rate": round(reused / tokens, 6) if tokens else None}
        if last is not None:
            out["window_requests"] = last
        else:
            out["window_seconds"] = seconds
        return out
