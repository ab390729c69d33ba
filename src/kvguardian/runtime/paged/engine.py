"""A mini continuous-batching engine over `PagedLlama` and a `PagedKVPool`.

Each step schedules the running sequences first (one decode token each, or a recompute after preemption),
preempting the most recently admitted one when the pool runs out of blocks, then admits waiting requests
while the batch has room. All scheduled tokens run in one ragged forward pass; each sequence that has
caught up samples one greedy token. Blocks are managed by a `Scheduler`: `OwnershipScheduler` binds them to
(request, tenant) tables through the pool's high-level operations; the reproduction of the article's §2.2
plugs in a scheduler that keeps tables per batch slot instead.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kvguardian.core.errors import UsageError
from kvguardian.runtime.paged.model import PagedLlama, StepInput
from kvguardian.runtime.paged.pool import PagedKVPool

__all__ = ["Engine", "EngineResult", "OwnershipScheduler", "Request", "Scheduler", "Sequence"]


@dataclass(frozen=True)
class Request:
    """What a client submits."""

    request_id: str
    tenant: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    shared: str | None = None  # shared prefix namespace the tenant opted into, if any


@dataclass(eq=False)
class Sequence:
    """A request inside the engine. Only the engine mutates it (schedulers read it)."""

    req: Request  # write-once
    output: list[int] = field(default_factory=list)  # generated tokens so far
    num_computed: int = 0  # tokens whose K/V is in the pool (prompt first, then outputs)
    block_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))  # engine's table copy
    arrival: float = 0.0
    first_token: float | None = None
    last_token: float | None = None
    preemptions: int = 0
    finished: bool = False
    error: str | None = None  # set when the request was shed (ended early, under memory pressure)

    def __repr__(self) -> str:
        return f"<Sequence {self.req.request_id!r} {len(self.output)}/{self.req.max_new_tokens}>"

    @property
    def rid(self) -> str:
        return self.req.request_id

    def all_tokens(self) -> list[int]:
        return [*self.req.prompt, *self.output]


class Scheduler(Protocol):
    """Block management as the engine needs it. ``allocate`` returns the slots of ``seq``'s uncomputed
    tokens (setting ``seq.num_computed`` on a prefix hit at admission) or None when the pool has no room."""

    pool: PagedKVPool

    def admit(self, seq: Sequence) -> np.ndarray | None: ...

    def allocate(self, seq: Sequence) -> np.ndarray | None: ...

    def preempt(self, seq: Sequence) -> None: ...

    def finish(self, seqs: list[Sequence]) -> None: ...


class OwnershipScheduler:
    """Strict ownership: each request's blocks live in its own (request, tenant) table in the pool; prefix
    sharing (when the pool caches prefixes) only through the tenant-salted cache; copy-on-write by the pool."""

    def __init__(self, pool: PagedKVPool) -> None:
        self.pool = pool

    def admit(self, seq: Sequence) -> np.ndarray | None:
        pool, rid = self.pool, seq.rid
        if not pool.has_table(rid):
            pool.open(rid, seq.req.tenant, shared=seq.req.shared)
        tokens = seq.all_tokens()
        if not pool.can_allocate(pool.admission_cost(rid, tokens)):
            return None
        hit = pool.match_prefix(rid, tokens)
        seq.num_computed = hit
        return self._append(seq, tokens[hit:])

    def allocate(self, seq: Sequence) -> np.ndarray | None:
        tokens = seq.all_tokens()[seq.num_computed:]
        if not self.pool.can_allocate(self.pool.blocks_needed(seq.rid, len(tokens))):
            return None
        return self._append(seq, tokens)

    def _append(self, seq: Sequence, tokens: list[int]) -> np.ndarray:
        slots = self.pool.append(seq.rid, tokens)
        seq.block_ids = self.pool.block_ids(seq.rid)
        return slots

    def preempt(self, seq: Sequence) -> None:
        self.pool.preempt(seq.rid)
        seq.block_ids = np.empty(0, dtype=np.int32)

    def finish(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.pool.free(seq.rid)


@dataclass
class EngineResult:
    outputs: dict[str, list[int]]  # request id -> greedy tokens
    seconds: float  # wall time of the whole run
    steps: int
    preemptions: int
    tokens: int  # generated tokens
    ttft: dict[str, float]  # request id -> seconds from arrival to its first token
    tpot: dict[str, float]  # request id -> mean seconds per token after the first (0 for one token)

    def summary(self) -> dict[str, Any]:
        n = len(self.outputs)
        ttft = list(self.ttft.values())
        tpot = [v for k, v in self.tpot.items() if len(self.outputs[k]) > 1]
        return {
            "requests": n,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "requests_per_s": n / self.seconds if self.seconds else 0.0,
            "tokens_per_s": self.tokens / self.seconds if self.seconds else 0.0,
            "ttft_ms_mean": 1e3 * float(np.mean(ttft)) if ttft else 0.0,
            "ttft_ms_p50": 1e3 * float(np.median(ttft)) if ttft else 0.0,
            "tpot_ms_mean": 1e3 * float(np.mean(tpot)) if tpot else 0.0,
            "steps": self.steps,
            "preemptions": self.preemptions,
        }


Scheduled = tuple[Sequence, StepInput]


class Engine:
    """Continuous batching: at most ``max_num_seqs`` running, at most ``max_batch_tokens`` per step
    (a prompt longer than that runs alone).

    `run` takes a batch of requests to completion; a server `submit`s requests and calls `step` in a loop
    (`kvguardian.runtime.paged.loop.EngineLoop`). ``lock`` is held while the pool's tables change (scheduling and
    freeing), so another thread (the pre-OOM guard) can evict cached blocks safely. `request_preempt` and
    `request_shed` may be called from any thread and are carried out at the next step: preempted requests
    are recomputed later (none is dropped); shed ones end with ``seq.error`` set. `abort` is for the thread
    that steps, between steps.
    """

    def __init__(self, model: PagedLlama, scheduler: Scheduler, *, max_num_seqs: int = 8,
                 max_batch_tokens: int = 512, eos_token_id: int | None = None) -> None:
        if max_num_seqs < 1 or max_batch_tokens < 1:
            raise UsageError("max_num_seqs and max_batch_tokens must be >= 1")
        self.model = model
        self.scheduler = scheduler
        self.pool = scheduler.pool
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.eos_token_id = eos_token_id
        self.lock = threading.RLock()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.steps = 0
        self.preemptions = 0
        self.shed = 0
        self._asks = threading.Lock()
        self._preempt_asked = 0
        self._shed_asked = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def submit(self, req: Request, *, arrival: float | None = None) -> Sequence:
        """Queue ``req``; it is admitted at a later step."""
        seq = Sequence(req, arrival=time.perf_counter() if arrival is None else arrival)
        with self.lock:
            if any(s.rid == req.request_id for s in (*self.waiting, *self.running)):
                raise UsageError(f"request {req.request_id!r} is already in the engine; fix: unique request ids")
            self.waiting.append(seq)
        return seq

    def request_preempt(self, n: int = 1) -> int:
        """Ask for the ``n`` newest running requests to be preempted at the next step; returns how many will be."""
        with self._asks:
            k = max(min(n, len(self.running) - self._preempt_asked), 0)
            self._preempt_asked += k
        return k

    def request_shed(self, n: int = 1) -> int:
        """Ask for the ``n`` newest requests (running or waiting) to be ended at the next step."""
        with self._asks:
            k = max(min(n, len(self.running) + len(self.waiting) - self._shed_asked), 0)
            self._shed_asked += k
        return k

    def abort(self, request_id: str) -> Sequence | None:
        """Take ``request_id`` out of the engine now and give its blocks back (a client that went away); the
        sequence, or None when it is not in the engine. Call it between steps, from the thread that steps."""
        with self.lock:
            seq = next((s for s in (*self.running, *self.waiting) if s.rid == request_id), None)
            if seq is not None:
                self._remove(seq)
        return seq

    def run(self, requests: Iterable[Request]) -> EngineResult:
        """Submit every request at once and step until all have finished."""
        reqs = list(requests)
        if len({r.request_id for r in reqs}) != len(reqs):
            raise UsageError("request ids must be unique within a run")
        if self.has_work:
            raise UsageError("run() needs an idle engine; fix: finish the submitted requests first")
        t0 = time.perf_counter()
        seqs = [self.submit(r, arrival=t0) for r in reqs]
        steps0, preemptions0 = self.steps, self.preemptions
        while self.has_work:
            self.step()
        elapsed = time.perf_counter() - t0
        return EngineResult(
            outputs={s.rid: s.output for s in seqs},
            seconds=elapsed,
            steps=self.steps - steps0,
            preemptions=self.preemptions - preemptions0,
            tokens=sum(len(s.output) for s in seqs),
            ttft={s.rid: (s.first_token or t0) - s.arrival for s in seqs},
            tpot={s.rid: ((s.last_token or 0) - (s.first_token or 0)) / max(len(s.output) - 1, 1) for s in seqs},
        )

    def step(self) -> list[Sequence]:
        """One engine step. Returns the sequences that ended in it: finished, or shed (``error`` set)."""
        with self.lock:
            ended = self._shed_asked_for()
            forced = self._preempt_asked_for()
            batch, preempted = self._schedule(self.waiting, self.running, forced)
            self.preemptions += preempted
        if not batch:
            if ended or forced or not self.has_work:
                return ended
            raise UsageError(
                f"the pool ({self.pool.num_blocks} blocks of {self.pool.block_size}) cannot hold the next "
                "request alone; fix: a bigger pool or shorter requests"
            )
        logits = self.model.forward(self.pool, [inp for _, inp in batch])
        now = time.perf_counter()
        next_tokens = logits.argmax(-1).tolist()
        done = []
        for (seq, inp), tok in zip(batch, next_tokens):
            seq.num_computed = inp.start + len(inp.token_ids)
            seq.output.append(int(tok))
            if seq.first_token is None:
                seq.first_token = now
            seq.last_token = now
            if len(seq.output) >= seq.req.max_new_tokens or tok == self.eos_token_id:
                seq.finished = True
                done.append(seq)
        if done:
            with self.lock:
                for seq in done:
                    self.running.remove(seq)
                self.scheduler.finish(done)
        self.steps += 1
        return ended + done

    def _preempt_asked_for(self) -> int:
        with self._asks:
            n, self._preempt_asked = self._preempt_asked, 0
        k = 0
        while k < n and self.running:
            self._preempt(self.running.pop(), self.waiting)
            k += 1
        return k

    def _shed_asked_for(self) -> list[Sequence]:
        with self._asks:
            n, self._shed_asked = self._shed_asked, 0
        victims = sorted((*self.running, *self.waiting), key=lambda s: s.arrival, reverse=True)[:n]
        for seq in victims:
            self._remove(seq)
            seq.finished = True
            seq.error = "shed under memory pressure (the server was draining and memory still rose)"
        self.shed += len(victims)
        return victims

    def _remove(self, seq: Sequence) -> None:
        """Out of the queues; the scheduler frees what it holds for it (blocks, or a table opened by an
        admission that found no room)."""
        running = seq in self.running
        held = running or seq.preemptions > 0 or self.pool.has_table(seq.rid)
        (self.running if running else self.waiting).remove(seq)
        if held:
            self.scheduler.finish([seq])

    def _preempt(self, victim: Sequence, waiting: deque[Sequence]) -> None:
        self.scheduler.preempt(victim)
        victim.num_computed = 0
        victim.preemptions += 1
        waiting.appendleft(victim)

    def _schedule(self, waiting: deque[Sequence], running: list[Sequence],
                  forced: int = 0) -> tuple[list[Scheduled], int]:
        batch: list[Scheduled] = []
        budget = self.max_batch_tokens
        preempted = forced  # requests preempted this step (by request, then for blocks) block admission
        i = 0
        while i < len(running):  # running first, oldest first
            seq = running[i]
            slots = self.scheduler.allocate(seq)
            while slots is None:  # out of blocks: preempt the newest running sequence (maybe this one)
                victim = running.pop()
                self._preempt(victim, waiting)
                preempted += 1
                if victim is seq:
                    break
                slots = self.scheduler.allocate(seq)
            if slots is None:
                break
            batch.append((seq, self._input(seq, slots)))
            budget -= len(slots)
            i += 1
        while waiting and len(running) < self.max_num_seqs and not preempted:
            seq = waiting[0]
            pending = len(seq.req.prompt) + len(seq.output)
            if batch and pending > budget:
                break
            slots = self.scheduler.admit(seq)
            if slots is None:
                break
            waiting.popleft()
            running.append(seq)
            batch.append((seq, self._input(seq, slots)))
            budget -= len(slots)
        return batch, preempted

    @staticmethod
    def _input(seq: Sequence, slots: np.ndarray) -> StepInput:
        tokens = seq.all_tokens()[seq.num_computed:]
        return StepInput(seq.rid, tokens, seq.num_computed, slots, seq.block_ids)
