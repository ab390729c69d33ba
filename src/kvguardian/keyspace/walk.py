"""Walking the nodes of a scan in parallel: one thread per node (a Cluster's shards), one request in flight
on each, every probed batch handed to the one `Counting` of the scan.

One miner sees every key, so a pattern whose keys are spread over slots and shards is one pattern with its
counts and bytes summed: the merge happens key by key, never by matching names of patterns mined apart. A
node lost mid-walk ends only its own thread (its error is kept per node); the others go on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvguardian.keyspace.counting import Counting
from kvguardian.keyspace.pacing import BatchSizer
from kvguardian.keyspace.probe import Lane

__all__ = ["Bounds", "LaneTotals", "Walk"]

Progress = Callable[[int, int], None]  # (keys probed so far, total expected)


@dataclass
class Bounds:
    """When the walk stops before every cursor is back to 0, how fast it may go, whom it tells."""

    sample: int | None = None  # keys, all lanes together
    rate: float | None = None  # keys per second, all lanes together
    progress: Progress | None = None
    total: int = 0  # keys expected (the progress bar's total)
    stop: threading.Event | None = None  # set by the caller: end as interrupted


@dataclass
class LaneTotals:
    """What one node gave: keys probed, their bytes, and why it stopped early (None: it finished)."""

    keys: int = 0
    bytes: int = 0
    error: str | None = None


class Walk:
    """Every lane in a thread of its own until its cursor is back to 0, the sample is full, or a stop."""

    def __init__(self, lanes: list[Lane], sizers: list[BatchSizer], counting: Counting, bounds: Bounds) -> None:
        self.lanes, self.sizers, self.counting = lanes, sizers, counting
        self.sample, self.rate, self.progress, self.total = bounds.sample, bounds.rate, bounds.progress, bounds.total
        self.stop = bounds.stop
        self.totals = [LaneTotals() for _ in lanes]
        self.done = 0  # keys counted, all lanes
        self.sampled = False  # the sample is full
        self.interrupted = False
        self._lock = threading.Lock()
        self._halt = threading.Event()  # Ctrl-C in the waiting thread, or a lane that failed for good
        self._fatal: BaseException | None = None
        self._left = len(lanes)
        self._all_done = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        """Walk every lane; re-raises what ended a lane other than a lost connection (a refused permission)."""
        if not self.lanes:
            return
        for i, lane in enumerate(self.lanes):
            threading.Thread(target=self._lane, args=(i,), name=f"kvguardian-scan-{lane.where}", daemon=True).start()
        while not self._all_done.is_set():  # an Event, not Thread.join: Ctrl-C can interrupt this wait safely
            try:
                self._all_done.wait(0.2)
            except KeyboardInterrupt:
                self.interrupted = True
                self._halt.set()
        if self.stop is not None and self.stop.is_set():
            self.interrupted = True
        if self._fatal is not None:
            raise self._fatal

    def _stopping(self) -> bool:
        return self.sampled or self._halt.is_set() or (self.stop is not None and self.stop.is_set())

    def _lane(self, li: int) -> None:
        import redis

        lane, totals = self.lanes[li], self.totals[li]
        try:
            lane.send([], scan=True)
            while True:
                keys, probe, next_keys = lane.receive()
                if self.sizers:
                    lane.batch = self.sizers[li].observe(len(keys), lane.last_call_s)
                more = lane.cursor != 0
                if self._count(li, keys, probe) or self._stopping() or not (next_keys or more):
                    return
                self._throttle()
                lane.send(next_keys, scan=more)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            totals.error = f"{type(exc).__name__}: {exc}"
        except BaseException as exc:  # handed to the waiting thread; the other lanes stop
            self._fatal = exc
            self._halt.set()
        finally:
            lane.close(broken=totals.error is not None or self._fatal is not None)
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    self._all_done.set()

    def _count(self, li: int, keys: list[bytes], probe: np.ndarray | None) -> bool:
        """Hand one batch to the counting; True when the sample is full."""
        with self._lock:
            if self.sample is not None and self.done + len(keys) >= self.sample:
                keys = keys[: max(0, self.sample - self.done)]
                probe = probe[: len(keys)] if probe is not None else None
                self.sampled = True
            if keys and probe is not None:
                self.counting.add(keys, probe)
                self.done += len(keys)
                self.totals[li].keys += len(keys)
                self.totals[li].bytes += int(np.clip(probe[:, 1], 0, None).sum())
                if self.progress is not None:
                    self.progress(self.done, self.total)
            return self.sampled

    def _throttle(self) -> None:
        """Hold this lane while the whole walk is ahead of ``--max-keys-per-sec``."""
        if self.rate:
            ahead = self.done / self.rate - (time.monotonic() - self._t0)
            if ahead > 0:
                time.sleep(ahead)
