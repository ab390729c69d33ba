"""A mini continuous-batching engine over `PagedLlama` and a `PagedKVPool`.

Each step schedules the running sequences first (one decode token each, or a recompute after preemption),
preempting the most recently admitted one when the pool runs out of blocks, then admits waiting requests
while the batch has room. All scheduled tokens run in one ragged forward pass; each sequence that has
caught up samples one greedy token. Blocks are managed by a `Scheduler`: `OwnershipScheduler` binds them to
(request, tenant) tables through the pool's high-level operations; the reproduction of the article's §2.2
plugs in a scheduler that keeps tables per batch slot instead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kvguardian._errors import UsageError
from kvguardian.paged.model import PagedLlama, StepInput
from kvguardian.paged.pool import PagedKVPool

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
    (a prompt longer than that runs alone)."""

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

    def run(self, requests: Iterable[Request]) -> EngineResult:
        """Submit every request at once and step until all have finished."""
        t0 = time.perf_counter()
        seqs = [Sequence(r, arrival=t0) for r in requests]
        if len({s.rid for s in seqs}) != len(seqs):
            raise UsageError("request ids must be unique within a run")
        waiting: deque[Sequence] = deque(seqs)
        running: list[Sequence] = []
        steps = preemptions = 0
        while waiting or running:
            batch, preempted = self._schedule(waiting, running)
            preemptions += preempted
            if not batch:
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
                for seq in done:
                    running.remove(seq)
                self.scheduler.finish(done)
            steps += 1
        elapsed = time.perf_counter() - t0
        return EngineResult(
            outputs={s.rid: s.output for s in seqs},
            seconds=elapsed,
            steps=steps,
            preemptions=preemptions,
            tokens=sum(len(s.output) for s in seqs),
            ttft={s.rid: (s.first_token or t0) - s.arrival for s in seqs},
            tpot={s.rid: ((s.last_token or 0) - (s.first_token or 0)) / max(len(s.output) - 1, 1) for s in seqs},
        )

    def _schedule(self, waiting: deque[Sequence], running: list[Sequence]) -> tuple[list[Scheduled], int]:
        batch: list[Scheduled] = []
        budget = self.max_batch_tokens
        preempted = 0
        i = 0
        while i < len(running):  # running first, oldest first
            seq = running[i]
            slots = self.scheduler.allocate(seq)
            while slots is None:  # out of blocks: preempt the newest running sequence (maybe this one)
                victim = running.pop()
                self.scheduler.preempt(victim)
                victim.num_computed = 0
                victim.preemptions += 1
                preempted += 1
                waiting.appendleft(victim)
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
