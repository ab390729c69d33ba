"""The pre-OOM guard: sample memory signals, evict at the first watermark, drain at the second, never OOM.

    oom = OOMGuard([cgroup_signal_for_pid()], interval=0.05)
    oom.watch_guard(guard)                  # the ledger, guard.retain(..., evict=...) callbacks, KV budget
    oom.watch_pool(pool, lock=engine.lock)  # pool occupancy; its prefix cache is evicted first
    oom.start()                             # a daemon thread samples every interval

Allocation paths wake the sampling thread; each sample acts on the highest ratio (`kvguardian.ops.oom.policy`,
`kvguardian.ops.oom.actions`). Every action is a ledger event, a metric and a log line; nothing raises into the
guarded program. Details: docs/design/oom.md.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvguardian.core.errors import KVGuardianError
from kvguardian.ops.oom.actions import CallbackAction, Evicted, PoolPrefixEviction, RetainedEviction, release_memory
from kvguardian.ops.oom.policy import PolicyState, Watermarks, decide
from kvguardian.ops.oom.signals.base import Reading, Signal
from kvguardian.runtime.sources.evictable import EvictCallback, EvictorRegistry, registry_of

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from kvguardian.runtime.guard import Guard
    from kvguardian.runtime.paged import PagedKVPool

__all__ = ["Action", "OOMGuard", "Overloaded", "Reservation"]

log = logging.getLogger("kvguardian.oom")

_MAX_EVICT_STEPS = 8  # eviction steps per pass, at most (each re-reads the signals)


class Overloaded(KVGuardianError):
    """The guard refuses new work: the server should answer 503 with ``Retry-After: retry_after``."""

    exit_code = 3

    def __init__(self, message: str, *, retry_after: float, reason: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.reason = reason  # "draining", "shutdown", "projected", "shed"


@dataclass(frozen=True)
class Action:
    """One thing the guard did (kept in a bounded history for `status`)."""

    ts: float  # time.monotonic()
    action: str  # evict, preempt, shed, drain_start, drain_end, shutdown_drain, evict_start, evict_end, reject
    reason: str
    detail: str
    count: int = 0
    nbytes: int | None = None
    pressure: float | None = None  # the pressure when it acted

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "action": self.action, "reason": self.reason, "detail": self.detail,
                "count": self.count, "nbytes": self.nbytes, "pressure": self.pressure}


class Reservation:
    """Memory an admitted request is about to take (see `OOMGuard.admit`)."""

    __slots__ = ("_guard", "_pending", "nbytes")

    def __init__(self, guard: OOMGuard, nbytes: int) -> None:
        self._guard = guard
        self.nbytes = nbytes
        self._pending = nbytes > 0

    def allocated(self) -> None:
        """The memory is taken: it shows in the signals from now on."""
        if self._pending:
            self._pending = False
            self._guard.settle_reservation(self.nbytes)

    def close(self) -> None:
        self.allocated()

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OOMGuard:
    """Watches memory signals and keeps the process below its limit.

    Args:
        signals: `Signal` objects to sample (more via `add_signal`, `watch_pool`, `watch_guard`).
        watermarks: evict / drain / shed fractions and the hysteresis.
        interval: seconds between samples of the sampling thread (`start`).
        allocate_gap: an allocation triggers a sample when the last one is older than this (default: the
            smaller of ``interval`` and 5 ms).
        retry_after: seconds a rejected client is told to wait (``Retry-After``).
        release: call ``malloc_trim`` after evicting retained caches, so freed pages leave the cgroup.
    """

    def __init__(self, signals: Iterable[Signal] = (), *, watermarks: Watermarks | None = None,
                 interval: float = 0.05, allocate_gap: float | None = None, retry_after: float = 1.0,
                 release: bool = True, history: int = 256, clock: Callable[[], float] = time.monotonic) -> None:
        from kvguardian.core.errors import UsageError

        if not interval > 0:
            raise UsageError(f"interval {interval!r} must be a positive number of seconds; fix: e.g. 0.05")
        self.watermarks = watermarks or Watermarks()
        self.interval = float(interval)
        self.allocate_gap = min(self.interval, 0.005) if allocate_gap is None else float(allocate_gap)
        self.retry_after = retry_after
        self.release = release
        self._clock = clock
        self.signals: list[Signal] = list(signals)
        self.registry = EvictorRegistry()
        self._pool_steps: list[PoolPrefixEviction] = []
        self._preempt: CallbackAction | None = None
        self._shed: CallbackAction | None = None
        self._guard: Guard | None = None  # ledger events
        self.state = PolicyState()
        self.readings: list[Reading] = []
        self.pressure: float | None = None
        self.worst: Reading | None = None
        self._last_sample = float("-inf")
        self._lock = threading.Lock()  # one sample at a time
        self._cond = threading.Condition()  # in-flight requests
        self.in_flight = 0
        self.shutdown = False  # /drain was called: stays not ready until the process ends
        self.history: deque[Action] = deque(maxlen=history)
        self.first: dict[str, Action] = {}  # the first action of each kind (a handful of kinds: bounded)
        self.actions: Counter[str] = Counter()  # actions by kind
        self.peak_pressure: float | None = None
        self.evictions: Counter[str] = Counter()  # reason -> blocks / caches / requests
        self.evicted_bytes: Counter[str] = Counter()
        self.samples: Counter[str] = Counter()  # cause -> samples
        self.signal_errors: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()  # the guard's own contained errors, by site
        self.rejected = 0
        self.shed_requests = 0
        self.preempted = 0
        self._rejected_in_drain = 0
        self._admit_lock = threading.Lock()  # admissions with bytes, one at a time
        self._pending = 0  # bytes admitted requests reserved and have not allocated yet
        self._stale = False  # a reservation was allocated since the last sample
        self._logged: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # an allocation asks the sampling thread for a sample now
        self._woken = False

    def __repr__(self) -> str:
        return (f"<OOMGuard signals={[s.name for s in self.signals]} pressure={self.pressure} "
                f"draining={self.state.draining} in_flight={self.in_flight}>")

    @classmethod
    def for_process(cls, guard: Guard | None = None, *, budget_mb: int | str | None = None, cuda: bool = True,
                    **kwargs: Any) -> OOMGuard:
        """A guard for this process: its memory cgroup (when it has a limit), every CUDA device torch sees
        (when torch is already imported and has CUDA), and, with a `kvguardian.Guard`, its ledger against
        the KV budget (``budget_mb``, else ``KVG_KV_BUDGET_MB`` / ``NV_GPU_KV_CACHE_MB``). A signal that is
        not there is left out with one log line. Keyword arguments go to `OOMGuard`.

        Raises:
            UsageError: the KV budget is malformed, 0, or larger than the GPU.
        """
        import sys

        from kvguardian.core.errors import UsageError
        from kvguardian.ops.oom.budget import kv_budget
        from kvguardian.ops.oom.signals.cgroup import cgroup_signal_for_pid
        from kvguardian.ops.oom.signals.cuda import CudaSignal

        oom = cls(**kwargs)
        try:
            cg = cgroup_signal_for_pid("self")
            if cg.read().limit is None:
                oom._log_once("nolimit", f"{cg.path} has no memory limit: host memory is not guarded")
            else:
                oom.add_signal(cg)
        except UsageError as exc:
            oom._log_once("nocgroup", f"no memory cgroup ({exc}): host memory is not guarded")
        device = None
        torch = sys.modules.get("torch")
        if cuda and torch is not None and torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                sig = CudaSignal(i, torch=torch)
                oom.add_signal(sig)
                r = sig.read()
                device = r.limit if device is None or r.limit is None else min(device, r.limit)
        budget = kv_budget(budget_mb, device_bytes=device)
        if guard is not None:
            oom.watch_guard(guard, budget_bytes=budget.nbytes if budget else None,
                            budget_source=budget.source if budget else "argument")
        elif budget is not None:
            oom._log_once("budget", f"a KV budget is set ({budget.source}) but no kvguardian.Guard counts KV: "
                                    "pass guard= to enforce it")
        return oom

    # ------------------------------------------------------------------ configuration
    def add_signal(self, signal: Signal) -> OOMGuard:
        self.signals.append(signal)
        return self

    def watch_pool(self, pool: PagedKVPool, *, name: str = "main", lock: AbstractContextManager[Any] | None = None,
                   hook: bool = True) -> OOMGuard:
        """Add the pool's occupancy signal and its prefix cache as the first eviction step; with ``hook``,
        every allocation of the pool samples (``pool.on_allocate``). ``lock`` is what the pool's engine holds
        while it schedules (eviction takes it; the pool is not thread-safe)."""
        from kvguardian.ops.oom.signals.pool import PoolSignal

        self.signals.append(PoolSignal(pool, name=name))
        self._pool_steps.append(PoolPrefixEviction(pool, name=name, lock=lock))
        if hook:
            pool.on_allocate = self.on_allocate
        return self

    def watch_guard(self, guard: Guard, *, budget_bytes: int | None = None, budget_source: str = "argument",
                    hf_hook: bool = True) -> OOMGuard:
        """Use a `kvguardian.Guard`: actions become ledger events, its ``retain(..., evict=...)`` callbacks
        are evicted, its ledger's KV bytes are a signal against ``budget_bytes`` (if given), and with
        ``hf_hook`` every first cache update of a request (transformers) samples."""
        from kvguardian.ops.oom.signals.ledger import LedgerBudgetSignal

        self._guard = guard
        self.registry = registry_of(guard)
        if budget_bytes is not None:
            self.signals.append(LedgerBudgetSignal(guard.ledger, budget_bytes, source=budget_source))
        if hf_hook:
            guard.on_kv_growth = self.on_allocate
        return self

    def retain(self, obj: object, *, reason: str, evict: EvictCallback) -> None:
        """Register an evictable retained cache (the same registry as ``guard.retain(..., evict=...)``)."""
        self.registry.add(obj, reason, evict)

    def on_preempt(self, fn: Callable[[int], int], *, relieves: Callable[[str], bool] | None = None) -> OOMGuard:
        """Preempt ``n`` running requests (recomputed later, none dropped) as the last eviction step, for the
        signals ``relieves(signal)`` says it helps (default: all)."""
        self._preempt = CallbackAction("preempt", fn, relieves)
        return self

    def on_shed(self, fn: Callable[[int], int]) -> OOMGuard:
        """End the ``n`` newest requests with a clear error when memory still rises while draining."""
        self._shed = CallbackAction("shed", fn)
        return self

    # ------------------------------------------------------------------ the sampling thread
    def start(self) -> OOMGuard:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="kvguardian-oom", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OOMGuard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            cause = "allocate" if self._woken else "interval"
            self._woken = False
            self._wake.clear()
            self.sample(cause, wait=True)
            self._wake.wait(self.interval)

    # ------------------------------------------------------------------ hot paths
    def on_allocate(self, n: int = 0) -> None:
        """Called by allocation paths (the pool's allocate, an HF cache's first update): when the last
        sample is older than ``allocate_gap``, wakes the sampling thread for a sample now (or, without a
        running thread, samples here). The allocating thread pays a clock read and, at most once per
        gap, an event. Never raises."""
        try:
            if not self._woken and self._clock() - self._last_sample >= self.allocate_gap:
                if self._thread is not None:
                    self._woken = True
                    self._wake.set()
                else:
                    self.sample("allocate")
        except Exception as exc:
            self._contain("allocate", exc)

    def admit(self, nbytes: int = 0, *, signal: str = "cgroup") -> Reservation:
        """Admit a new request, or raise `Overloaded`.

        ``nbytes``, memory the request is about to take in ``signal``, is refused when the signal's last reading plus
        what admitted requests reserved plus ``nbytes`` would cross the shed watermark. Call ``allocated()`` on the
        returned `Reservation` once the memory is taken and ``close()`` when the request ends (it is also a context
        manager). Why reservations: docs/design/oom.md.

        Raises:
            Overloaded: shutting down, draining, or the request would cross the shed watermark.
        """
        if self.shutdown:
            self._reject("shutdown", "the server is draining for shutdown")
        if nbytes <= 0:
            self.on_allocate()
            if self.state.draining:
                self._reject("draining", self._draining_message())
            return Reservation(self, 0)
        with self._admit_lock:
            if self._stale:
                self._stale = False
                self.sample("allocate", wait=True)
            else:
                self.on_allocate()
            if self.state.draining:
                self._reject("draining", self._draining_message())
            for r in self.readings:
                if r.signal == signal and r.used is not None and r.limit:
                    after = (r.used + self._pending + nbytes) / r.limit
                    if after >= self.watermarks.shed:
                        self._reject("projected", f"{nbytes} more bytes would take {r.signal} to {_pct(after)} "
                                                  f"({self._pending} bytes already reserved), past the shed "
                                                  f"watermark {_pct(self.watermarks.shed)}")
            self._pending += nbytes
        return Reservation(self, nbytes)

    def settle_reservation(self, nbytes: int) -> None:
        """A reservation of ``nbytes`` was allocated (or given up): it leaves the pending sum, and the next
        admission samples the signals again (they show the memory from now on)."""
        with self._admit_lock:
            self._pending -= nbytes
            self._stale = True

    def _draining_message(self) -> str:
        return (f"memory pressure {_pct(self.pressure)} is above the drain watermark "
                f"({_pct(self.watermarks.drain)}) on {self._worst_name()}")

    def _reject(self, reason: str, message: str) -> None:
        with self._cond:
            self.rejected += 1
            self._rejected_in_drain += 1
            first = self._rejected_in_drain == 1
        if first:
            self._record("reject", reason, f"rejecting new requests (503, Retry-After {self.retry_after:g}s): "
                                           f"{message}", kind="pressure")
        raise Overloaded(message, retry_after=self.retry_after, reason=reason)

    def request_started(self) -> None:
        with self._cond:
            self.in_flight += 1

    def request_finished(self) -> None:
        with self._cond:
            self.in_flight -= 1
            self._cond.notify_all()

    @property
    def ready(self) -> bool:
        """Readiness: false while draining (pressure) or after `drain` (shutdown)."""
        return not (self.shutdown or self.state.draining)

    @property
    def ready_to_stop(self) -> bool:
        """Not admitting and nothing in flight: preStop can let the container stop."""
        return not self.ready and self.in_flight == 0

    def drain(self, deadline: float, *, idle: Callable[[], bool] | None = None, poll: float = 0.05) -> dict[str, Any]:
        """For preStop: stop admitting for good, wait until nothing is in flight (and ``idle()`` is true, if
        given: e.g. a watched server reports no running request) or ``deadline`` seconds pass."""
        t0 = self._clock()
        if not self.shutdown:
            self.shutdown = True
            self._record("shutdown_drain", "prestop", f"draining for shutdown: {self.in_flight} request(s) in "
                                                      f"flight, deadline {deadline:g}s", kind="pressure")
        while True:
            busy = self.in_flight > 0 or (idle is not None and not _safe(idle))  # idle() may scrape: no lock
            left = deadline - (self._clock() - t0)
            if not busy or left <= 0:
                break
            with self._cond:
                self._cond.wait(min(poll, left))
        done = not busy
        waited = self._clock() - t0
        self._record("drained" if done else "drain_deadline", "prestop",
                     f"{'drained' if done else 'drain deadline passed'} after {waited:.2f}s, "
                     f"{self.in_flight} request(s) in flight", kind="pressure")
        return {"drained": done, "in_flight": self.in_flight, "waited_s": round(waited, 3)}

    # ------------------------------------------------------------------ sampling
    def sample(self, cause: str = "manual", *, wait: bool = False) -> PolicyState:
        """Read every signal, update the state, act. With another sample in progress, returns the current
        state at once (unless ``wait``)."""
        if not self._lock.acquire(blocking=wait):
            return self.state
        try:
            self._sample(cause)
        except Exception as exc:  # a bug in the guard must not reach the program
            self._contain(f"sample.{cause}", exc)
        finally:
            self._lock.release()
        return self.state

    def _sample(self, cause: str) -> None:
        self._last_sample = self._clock()
        self.samples[cause] += 1
        self._read_all()
        prev = self.state
        st = decide(prev, self.pressure, self.watermarks)
        self.state = st
        self._transitions(prev, st)
        if st.act_evict:
            self._evict_pass()
        if st.act_shed:
            self._shed_newest()

    def _read_all(self) -> None:
        readings = []
        for sig in self.signals:
            try:
                r = sig.read()
            except Exception as exc:  # a signal's read should not raise; contain it if it does
                from kvguardian.ops.oom.signals.base import failed

                r = failed(getattr(sig, "name", "?"), type(sig).__name__, exc)
            if r.error is not None:
                self.signal_errors[r.signal] += 1
                self._log_once(f"signal:{r.signal}", f"signal {r.signal} cannot be read ({r.error}); it is "
                                                     "reported as down and the other signals are kept")
            readings.append(r)
        worst = max((r for r in readings if r.ratio is not None), key=lambda r: r.ratio or 0.0, default=None)
        self.readings = readings
        self.worst = worst
        self.pressure = worst.ratio if worst is not None else None
        if self.pressure is not None and (self.peak_pressure is None or self.pressure > self.peak_pressure):
            self.peak_pressure = self.pressure

    def _transitions(self, prev: PolicyState, st: PolicyState) -> None:
        wm, p, who = self.watermarks, _pct(self.pressure), self._worst_name()
        if st.evicting and not prev.evicting:
            self._record("evict_start", who, f"memory pressure {p} on {who} crossed the evict watermark "
                                             f"{_pct(wm.evict)}", kind="pressure")
        elif prev.evicting and not st.evicting:
            self._record("evict_end", who, f"memory pressure {p} is below {_pct(wm.evict_target)}", kind="pressure")
        if st.draining and not prev.draining:
            with self._cond:
                self._rejected_in_drain = 0
            self._record("drain_start", who, f"memory pressure {p} on {who} crossed the drain watermark "
                                             f"{_pct(wm.drain)}: readiness false, new requests get 503, "
                                             f"{self.in_flight} in flight continue", kind="pressure")
        elif prev.draining and not st.draining:
            with self._cond:
                n, self._rejected_in_drain = self._rejected_in_drain, 0
            self._record("drain_end", who, f"memory pressure {p} is below {_pct(wm.drain - wm.hysteresis)}: ready "
                                           f"again ({n} request(s) were rejected while draining)", kind="pressure")

    def _steps(self) -> list[tuple[Callable[[str], bool], Callable[[int], list[Evicted]]]]:
        """(relieves(signal), run(need)) in order: pool prefix caches, retained caches, preemption."""
        steps: list[tuple[Callable[[str], bool], Callable[[int], list[Evicted]]]] = [
            (s.relieves, s.run) for s in self._pool_steps]
        retained = RetainedEviction(self.registry, self._contain)
        steps.append((retained.relieves, retained.run))
        if self._preempt is not None:
            steps.append((self._preempt.relieves, self._preempt_step))
        return steps

    def _need(self) -> int:
        w = self.worst
        if w is None or w.ratio is None or not w.limit:
            return 0
        assert w.used is not None
        return max(w.used - math.floor(self.watermarks.evict_target * w.limit) + 1, 0)

    def _evict_pass(self) -> None:
        target = self.watermarks.evict_target
        for n, (relieves, step) in enumerate(self._steps()):
            if n >= _MAX_EVICT_STEPS or self.pressure is None or self.pressure < target:
                return
            who, before = self._worst_name(), self.pressure
            if not relieves(who):
                continue
            done = step(self._need())
            if not done:
                continue
            for ev in done:
                self.evictions[ev.reason] += ev.count
                if ev.nbytes:
                    self.evicted_bytes[ev.reason] += ev.nbytes
            if self.release and any(ev.releases_heap for ev in done):
                release_memory()
            self._read_all()
            for ev in done:
                size = f", {ev.nbytes} bytes" if ev.nbytes is not None else ""
                self._record("preempt" if ev.reason == "preempt" else "evict", ev.reason,
                             f"evicted {ev.count} ({ev.reason}{size}) at {_pct(before)} on {who}: now "
                             f"{_pct(self.pressure)}", count=ev.count, nbytes=ev.nbytes, kind="evict",
                             pressure=before)

    def _preempt_step(self, need: int) -> list[Evicted]:
        assert self._preempt is not None
        n = self._preempt.run(1)
        self.preempted += n
        return [Evicted("preempt", n, None)] if n else []

    def _shed_newest(self) -> None:
        if self._shed is None:
            self._log_once("shed", f"memory pressure {_pct(self.pressure)} passed the shed watermark "
                                   f"{_pct(self.watermarks.shed)} while draining, and no shedder is configured")
            return
        n = self._shed.run(1)
        if n:
            self.shed_requests += n
            self._record("shed", self._worst_name(), f"shed the {n} newest request(s) at {_pct(self.pressure)} on "
                                                     f"{self._worst_name()} (503, Retry-After)", count=n,
                         kind="pressure")

    # ------------------------------------------------------------------ records
    def _record(self, action: str, reason: str, detail: str, *, count: int = 0, nbytes: int | None = None,
                kind: str, pressure: float | None = None) -> None:
        act = Action(self._clock(), action, reason, detail, count, nbytes,
                     self.pressure if pressure is None else pressure)
        self.history.append(act)
        self.first.setdefault(action, act)
        self.actions[action] += 1
        log.warning("kv-guardian oom: %s", detail)
        g = self._guard
        if g is not None:
            try:
                g.ledger.notes.cache_event(kind, cache=f"oom-guard:{action}", request=None, nbytes=nbytes or 0,
                                          detail=detail)
            except Exception as exc:
                self._contain("ledger", exc)

    def _contain(self, site: str, exc: BaseException) -> None:
        self.errors[site] += 1
        self._log_once(f"error:{site}", f"error in the OOM guard at {site} ({type(exc).__name__}: {exc}); "
                                        "contained, the program is unaffected")

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning("kv-guardian oom: %s", message)

    def _worst_name(self) -> str:
        return self.worst.signal if self.worst is not None else "no signal"

    def status(self) -> dict[str, Any]:
        """JSON-ready: readiness, state, pressure, every reading, counters and the latest actions."""
        return {
            "ready": self.ready,
            "ready_to_stop": self.ready_to_stop,
            "draining": self.state.draining,
            "evicting": self.state.evicting,
            "shutdown": self.shutdown,
            "in_flight": self.in_flight,
            "pressure": self.pressure,
            "worst_signal": self.worst.signal if self.worst is not None else None,
            "watermarks": {"evict": self.watermarks.evict, "drain": self.watermarks.drain,
                           "shed": self.watermarks.shed, "hysteresis": self.watermarks.hysteresis},
            "readings": [r.to_dict() for r in self.readings],
            "evictions": dict(self.evictions),
            "evicted_bytes": dict(self.evicted_bytes),
            "rejected": self.rejected,
            "shed": self.shed_requests,
            "preempted": self.preempted,
            "samples": dict(self.samples),
            "errors": dict(self.errors),
            "peak_pressure": self.peak_pressure,
            "action_counts": dict(self.actions),
            "first_actions": {k: a.to_dict() for k, a in self.first.items()},
            "actions": [a.to_dict() for a in list(self.history)[-20:]],
        }


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f}%"


def _safe(fn: Callable[[], bool]) -> bool:
    try:
        return bool(fn())
    except Exception:
        return False
