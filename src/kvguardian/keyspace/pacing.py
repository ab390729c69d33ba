"""How much work one scan call gives the server, and how the scan's own client work yields the CPU.

Redis runs one command at a time, so a probe batch sets the worst stall a concurrent request meets.
`BatchSizer` keeps it under ``max_call_s``: the probe script times itself, and the next ``SCAN COUNT`` is what
fits the budget at the measured cost per key. `lower_priority` renices the calling thread so mining takes only
spare CPU. Why pipelining would not help: docs/design/keyspace.md.
"""

from __future__ import annotations

import os
import statistics
import threading
from collections import deque

__all__ = ["BatchSizer", "lower_priority"]


class BatchSizer:
    """The next batch size from the measured server time per key.

    The cost per key is the median of the last few calls: a call that ran long because the server was
    descheduled mid-script (on a busy host, many times its usual length) must not shrink the batch for the
    many calls after it, as a running mean would; a real rise in cost shows in the median within a few
    calls. A call over budget still halves the batch at once."""

    WINDOW = 9  # calls the median is taken over

    def __init__(self, max_call_s: float = 0.0005, *, start: int = 50, low: int = 10, high: int = 1000) -> None:
        self.max_call_s = max_call_s
        self.low, self.high = low, high
        self.batch = max(low, min(start, high))
        self.per_key_s: float | None = None  # median server seconds per key over the last WINDOW calls
        self.worst_call_s = 0.0  # the longest probe call seen
        self.calls = 0
        self._costs: deque[float] = deque(maxlen=self.WINDOW)

    def observe(self, keys: int, server_s: float) -> int:
        """One probe of ``keys`` keys took ``server_s`` on the server; returns the next batch size."""
        if keys <= 0 or server_s < 0:
            return self.batch
        self.calls += 1
        self.worst_call_s = max(self.worst_call_s, server_s)
        self._costs.append(server_s / keys)
        self.per_key_s = statistics.median(self._costs)
        fit = int(self.max_call_s / max(self.per_key_s, 1e-7))
        # over budget: shrink at once; under: grow by at most 1.5x
        fit = min(fit, self.batch // 2 if server_s > self.max_call_s else int(self.batch * 1.5) + 1)
        self.batch = max(self.low, min(fit, self.high))
        return self.batch


def lower_priority(nice: int = 10) -> bool:
    """Raise the calling thread's nice value by ``nice`` (Linux: per thread; elsewhere the whole process).
    An unprivileged process cannot lower it back, so call it from a thread that does only the scan. False if
    the platform has no nice values."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return False
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + nice))
        return True
    except OSError:
        return False
