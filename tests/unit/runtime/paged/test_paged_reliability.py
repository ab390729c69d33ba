"""Reliability of the paged pool, driven by hypothesis.

1. A stateful test runs random sequences of open / prefix hit / append / fork / raw allocate / raw share /
   raw release / free / preempt / resume / evict / clear on a debug pool that raises at any finding, and after
   every step checks the full audit, the block accounting and the K/V contents of every table against a model
   (so a block handed to the wrong request shows up as wrong contents, not only as wrong counts).
2. A fault-injection test runs a random fault-free prefix (which must raise no finding: no false alarm), then
   injects one fault of each class and requires the finding of that class at the injected operation.
"""

from __future__ import annotations

import hashlib

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvguardian.runtime.paged import KVSpec, PagedKVPool

BS = 4
NUM_BLOCKS = 24
TENANTS = ("acme", "globex")


def sig(namespace: str, prefix: tuple[int, ...]) -> float:
    """The K value of the token ending ``prefix``: equal prefixes in one namespace share contents."""
    digest = hashlib.blake2b(repr((namespace, prefix)).encode(), digest_size=3).digest()
    return float(int.from_bytes(digest, "little"))


class Driver:
    """Valid pool operations with a model of what every table must contain."""

    def __init__(self, debug: bool = True, on_fault: str = "raise") -> None:
        self.pool = PagedKVPool(NUM_BLOCKS, BS, KVSpec(1, 1, 1), debug=debug, on_fault=on_fault)
        self.tokens: dict[str, list[int]] = {}  # high-level requests: tokens stored so far
        self.preempted: dict[str, list[int]] = {}  # preempted requests: tokens to recompute
        self.raw: dict[str, dict[int, list[float]]] = {}  # raw-path requests: block -> expected contents
        self.ns: dict[str, str] = {}  # request -> the namespace it must be isolated in (the model's own)
        self.n = 0

    def new_id(self) -> str:
        self.n += 1
        return f"r{self.n}"

    def _write(self, rid: str, slots: np.ndarray, start: int) -> None:
        toks = self.tokens[rid]
        vals = torch.tensor([sig(self.ns[rid], tuple(toks[: i + 1])) for i in range(start, start + len(slots))])
        v = vals.view(-1, 1, 1)
        self.pool.write(rid, 0, torch.from_numpy(slots), v, -v)

    # ------------------------------------------------------------------ high-level path
    def admit(self, tenant: str, shared: str | None, prompt: list[int], rid: str | None = None) -> None:
        p = self.pool
        rid = rid or self.new_id()
        if not p.has_table(rid):
            p.open(rid, tenant, shared=shared)
            self.ns[rid] = f"shared:{shared}" if shared else f"tenant:{tenant}"
        hit = p.match_prefix(rid, prompt)
        if not p.can_allocate(p.blocks_needed(rid, len(prompt) - hit)):
            p.free(rid)
            self.preempted.pop(rid, None)
            return
        self.tokens[rid] = list(prompt)
        self.preempted.pop(rid, None)
        self._write(rid, p.append(rid, prompt[hit:]), hit)

    def decode(self, rid: str, token: int) -> None:
        p = self.pool
        if not p.can_allocate(p.blocks_needed(rid, 1)):
            return
        self.tokens[rid].append(token)
        self._write(rid, p.append(rid, [token]), len(self.tokens[rid]) - 1)

    def fork(self, rid: str) -> None:
        child = self.new_id()
        self.pool.fork(rid, child)
        self.tokens[child] = list(self.tokens[rid])
        self.ns[child] = self.ns[rid]

    def free(self, rid: str) -> None:
        self.pool.free(rid)
        del self.tokens[rid]

    def preempt(self, rid: str) -> None:
        self.pool.preempt(rid)
        self.preempted[rid] = self.tokens.pop(rid)

    def resume(self, rid: str) -> None:
        self.admit(self.pool.table(rid).tenant, None, self.preempted[rid], rid)

    # ------------------------------------------------------------------ raw path
    def raw_alloc(self, tenant: str, n: int, rid: str | None = None) -> None:
        p = self.pool
        if not p.can_allocate(n):
            return
        if rid is None:
            rid = self.new_id()
            p.open(rid, tenant)
            self.raw[rid] = {}
        ids = p.allocate_blocks(rid, n)
        for b in ids.tolist():
            vals = [float(1_000_000 + 97 * b + i + 7 * self.n) for i in range(BS)]
            self.raw[rid][b] = vals
            v = torch.tensor(vals).view(-1, 1, 1)
            p.write(rid, 0, torch.arange(b * BS, (b + 1) * BS), v, -v)

    def raw_share(self, dst: str, src: str) -> None:
        new = {b: v for b, v in self.raw[src].items() if b not in self.raw[dst]}
        if new:
            self.pool.share_blocks(dst, list(new))
            self.raw[dst].update(new)

    def raw_release(self, rid: str, k: int) -> None:
        blocks = list(self.raw[rid])[-k:]
        self.pool.release_blocks(rid, blocks)
        for b in blocks:
            del self.raw[rid][b]

    def raw_close(self, rid: str) -> None:
        self.pool.release_blocks(rid, list(self.raw[rid])[::-1])
        self.pool.close(rid)
        del self.raw[rid]

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        p = self.pool
        assert p.check_invariants() == []
        assert p.faults == []
        m = p.metrics()
        assert m["blocks_free"] + m["blocks_cached"] + m["blocks_referenced"] == NUM_BLOCKS
        assert m["blocks_cached"] + m["blocks_free"] == p.blocks.num_available
        for rid, toks in self.tokens.items():
            t = p.table(rid)
            assert t.num_tokens == len(toks) and t.namespace == self.ns[rid]
            k, v = p.gather(0, torch.from_numpy(t.block_ids.astype(np.int64)), len(toks))
            want = [sig(self.ns[rid], tuple(toks[: i + 1])) for i in range(len(toks))]
            assert k.flatten().tolist() == want, f"{rid}: K/V contents differ from the model"
            assert torch.equal(v, -k)
        for rid, blocks in self.raw.items():
            assert sorted(p.table(rid).block_ids.tolist()) == sorted(blocks)
            for b, vals in blocks.items():
                assert p.k[0][b].flatten().tolist() == vals


#: prompts often start with one of two "system prompts", so prefix hits (and cross-tenant attempts) are common
SYSTEM = ((), (1, 2, 3, 1, 2, 3, 1, 2), (3, 3, 2, 2, 1, 1, 3, 3, 2))
prompts = st.builds(lambda head, tail: [*head, *tail], st.sampled_from(SYSTEM),
                    st.lists(st.integers(1, 3), min_size=1, max_size=8))


class PoolMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.d = Driver()

    def _open_ids(self) -> list[str]:
        return sorted(self.d.tokens)

    @rule(tenant=st.sampled_from(TENANTS), shared=st.sampled_from([None, None, "sys"]), prompt=prompts)
    def admit(self, tenant, shared, prompt):
        self.d.admit(tenant, shared, prompt)

    @precondition(lambda self: self.d.tokens)
    @rule(data=st.data(), token=st.integers(1, 3))
    def decode(self, data, token):
        self.d.decode(data.draw(st.sampled_from(self._open_ids())), token)

    @precondition(lambda self: self.d.tokens)
    @rule(data=st.data(), op=st.sampled_from(["fork", "free", "preempt"]))
    def on_open_request(self, data, op):
        getattr(self.d, op)(data.draw(st.sampled_from(self._open_ids())))

    @precondition(lambda self: self.d.preempted)
    @rule(data=st.data())
    def resume(self, data):
        self.d.resume(data.draw(st.sampled_from(sorted(self.d.preempted))))

    @rule(tenant=st.sampled_from(TENANTS), n=st.integers(1, 3))
    def raw_alloc(self, tenant, n):
        self.d.raw_alloc(tenant, n)

    @precondition(lambda self: self.d.raw)
    @rule(data=st.data(), n=st.integers(1, 2))
    def raw_grow(self, data, n):
        self.d.raw_alloc("", n, data.draw(st.sampled_from(sorted(self.d.raw))))

    @precondition(lambda self: len(self.d.raw) >= 2)
    @rule(data=st.data())
    def raw_share(self, data):
        dst = data.draw(st.sampled_from(sorted(self.d.raw)))
        same = [r for r in sorted(self.d.raw) if r != dst
                and self.d.pool.table(r).namespace == self.d.pool.table(dst).namespace]
        if same:
            self.d.raw_share(dst, data.draw(st.sampled_from(same)))

    @precondition(lambda self: any(self.d.raw.values()))
    @rule(data=st.data(), k=st.integers(1, 2))
    def raw_release(self, data, k):
        self.d.raw_release(data.draw(st.sampled_from(sorted(r for r, b in self.d.raw.items() if b))), k)

    @precondition(lambda self: self.d.raw)
    @rule(data=st.data())
    def raw_close(self, data):
        self.d.raw_close(data.draw(st.sampled_from(sorted(self.d.raw))))

    @rule(n=st.integers(1, 4))
    def evict(self, n):
        self.d.pool.evict_cached(n)

    @rule()
    def clear_prefix_cache(self):
        self.d.pool.reset_prefix_cache()

    @invariant()
    def consistent(self):
        self.d.check()


TestPoolStateful = PoolMachine.TestCase
TestPoolStateful.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------- fault injection
OPS = st.lists(
    st.tuples(st.sampled_from(["admit", "decode", "fork", "free", "preempt", "raw_alloc", "raw_share", "evict"]),
              st.integers(0, 10_000), prompts),
    max_size=25,
)


def apply_ops(d: Driver, ops) -> None:
    for op, k, prompt in ops:
        ids = sorted(d.tokens)
        raws = sorted(d.raw)
        if op == "admit":
            d.admit(TENANTS[k % 2], "sys" if k % 5 == 0 else None, prompt)
        elif op == "decode" and ids:
            d.decode(ids[k % len(ids)], prompt[0])
        elif op == "fork" and ids:
            d.fork(ids[k % len(ids)])
        elif op == "free" and ids:
            d.free(ids[k % len(ids)])
        elif op == "preempt" and ids:
            d.preempt(ids[k % len(ids)])
        elif op == "raw_alloc":
            d.raw_alloc(TENANTS[k % 2], 1 + k % 2)
        elif op == "raw_share" and len(raws) >= 2:
            dst, src = raws[k % len(raws)], raws[(k + 1) % len(raws)]
            if d.pool.table(dst).namespace == d.pool.table(src).namespace:
                d.raw_share(dst, src)
        elif op == "evict":
            d.pool.evict_cached(1 + k % 3)


def holder(d: Driver, tenant: str = "acme") -> tuple[str, int]:
    """A raw request of ``tenant`` holding at least one block (made if needed), and one of its blocks."""
    p = d.pool
    for rid, blocks in d.raw.items():
        if blocks and p.table(rid).tenant == tenant:
            return rid, next(iter(blocks))
    while not p.can_allocate(1):  # make room: free high-level requests, then raw ones
        if d.tokens:
            d.free(sorted(d.tokens)[0])
        else:
            d.raw_close(sorted(d.raw)[0])
    d.raw_alloc(tenant, 1)
    rid = max(d.raw, key=lambda r: int(r[1:]))
    return rid, next(iter(d.raw[rid]))


def inject(d: Driver, fault: str, monkeypatch) -> None:
    p = d.pool
    rid, b = holder(d)
    if fault == "KVG201":  # double free
        p.release_blocks(rid, [b])
        assert p.faults == []
        p.release_blocks(rid, [b])
    elif fault == "KVG202":  # use-after-free write
        p.release_blocks(rid, [b])
        assert p.faults == []
        p.write(rid, 0, torch.tensor([b * BS]), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1))
    elif fault == "KVG203":  # an internal bug: a share takes no reference
        p.open("victim", "acme")
        with monkeypatch.context() as m:
            m.setattr(p.blocks, "touch", lambda ids: None)
            p.share_blocks("victim", [b])
    elif fault == "KVG204":  # lost free: closed while holding blocks
        p.close(rid)
    elif fault == "KVG205":  # cross-tenant share
        p.open("intruder", "globex")
        p.share_blocks("intruder", [b])
    else:
        raise AssertionError(fault)


FAULTS = ("KVG201", "KVG202", "KVG203", "KVG204", "KVG205")


@pytest.mark.parametrize("fault", FAULTS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_every_injected_fault_is_caught_at_its_operation(fault, ops, monkeypatch):
    d = Driver(on_fault="record")
    apply_ops(d, ops)
    d.check()  # the fault-free prefix: no finding, clean audit (no false alarm)
    inject(d, fault, monkeypatch)
    p = d.pool
    faults = p.faults
    assert faults, f"{fault} was not caught"
    first = faults[0]
    assert first.id == fault, [f.message for f in faults]
    assert first.evidence["op_seq"] == p.op_seq  # caught at the injected operation, not later
    assert first.evidence["block"] == first.evidence["blocks"][0] and first.evidence["request_id"]
    assert p.check_invariants() or fault == "KVG202"  # the audit sees the damage too (a write changes no count)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_fault_free_runs_raise_no_alarm_in_record_mode(ops):
    d = Driver(on_fault="record")
    apply_ops(d, ops)
    d.check()
    assert sum(d.pool.faults_count.values()) == 0
