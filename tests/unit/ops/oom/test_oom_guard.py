"""OOMGuard with signals we set: the order of evictions, drain, shed, admission with reservations, fail-open,
the drain for preStop, ledger events, metrics, and registrations that never keep a cache alive."""

import gc
import threading
import time

import pytest

from kvg_oom import Knob
from kvguardian.core.exporters.catalog import names
from kvguardian.ops.oom.guard import OOMGuard, Overloaded
from kvguardian.ops.oom.policy import Watermarks
from kvguardian.runtime.guard import Guard
from kvguardian.runtime.paged import PagedKVPool
from kvguardian.runtime.sources.evictable import registry_of


class Store:
    """A retained cache: each evict frees up to ``chunk`` bytes of ``knob``."""

    def __init__(self, knob, chunk=30):
        self.knob, self.chunk, self.calls = knob, chunk, []

    def evict(self, need):
        self.calls.append(need)
        freed = min(self.chunk, self.knob.used)
        self.knob.used -= freed
        return freed


def test_below_the_evict_watermark_nothing_happens():
    knob = Knob(used=900)
    oom = OOMGuard([knob], release=False)
    store = Store(knob)
    oom.retain(store, reason="sessions", evict=store.evict)
    oom.sample()
    assert store.calls == [] and oom.ready and oom.pressure == 0.9


def test_retained_caches_are_evicted_in_order_until_below_the_target():
    knob = Knob(used=930)
    oom = OOMGuard([knob], release=False)
    first, second = Store(knob, chunk=20), Store(knob, chunk=100)
    oom.retain(first, reason="first", evict=first.evict)
    oom.retain(second, reason="second", evict=second.evict)
    oom.sample()
    assert first.calls == [41]  # (0.93 - 0.89) * 1000 + 1 bytes wanted
    assert second.calls == [21]  # what was still wanted after the first freed 20
    assert knob.used == 810 and oom.pressure == pytest.approx(0.81)
    assert oom.evictions == {"retained:first": 1, "retained:second": 1}
    assert oom.evicted_bytes == {"retained:first": 20, "retained:second": 100}
    assert [a.action for a in oom.history] == ["evict_start", "evict", "evict"]


def test_pool_prefix_cache_first_when_the_pool_is_the_pressure_and_preemption_last():
    pool = PagedKVPool(100, 16)
    for i in range(95):  # 95 cached prefix blocks, none referenced
        pool.open(f"r{i}", "t")
        pool.append(f"r{i}", [i] * 16)
        pool.free(f"r{i}")
    knob = Knob(used=0)
    oom = OOMGuard([knob], release=False).watch_pool(pool, hook=False)
    store = Store(knob)
    oom.retain(store, reason="sessions", evict=store.evict)
    preempted = []
    oom.on_preempt(lambda n: preempted.append(n) or n)
    oom.sample()
    assert oom.worst.signal == "pool:main" and oom.pressure < 0.89
    assert oom.evictions == {"pool_prefix:main": 7}  # 95 -> 88 blocks holding KV: below the 0.89 target
    assert store.calls == [] and preempted == []  # the pool's own cache sufficed


def test_a_preallocated_pools_cache_is_not_evicted_for_host_memory_pressure():
    pool = PagedKVPool(100, 16)
    pool.open("a", "t")
    pool.append("a", list(range(64)))
    pool.free("a")
    knob = Knob(used=950)
    oom = OOMGuard([knob], release=False).watch_pool(pool, hook=False)
    store = Store(knob, chunk=100)
    oom.retain(store, reason="sessions", evict=store.evict)
    oom.on_preempt(lambda n: n)
    oom.sample()
    assert "pool_prefix:main" not in oom.evictions and pool.metrics()["blocks_cached"] == 4
    assert oom.evictions["retained:sessions"] == 1 and oom.preempted == 0  # retained relieved it


def test_preemption_runs_when_nothing_else_helps():
    knob = Knob(used=950)
    oom = OOMGuard([knob], release=False)
    asked = []

    def preempt(n):
        asked.append(n)
        knob.used -= 100
        return n

    oom.on_preempt(preempt)
    oom.sample()
    assert asked == [1] and oom.evictions == {"preempt": 1} and oom.preempted == 1


def test_drain_rejects_new_requests_then_recovers_below_the_release_point():
    knob = Knob(used=975)
    oom = OOMGuard([knob], release=False, retry_after=2.5)
    oom.sample()
    assert not oom.ready and oom.state.draining
    with pytest.raises(Overloaded) as err:
        oom.admit()
    assert err.value.retry_after == 2.5 and err.value.reason == "draining" and "97.5%" in str(err.value)
    knob.used = 950  # inside the hysteresis band: still draining
    oom.sample()
    assert not oom.ready
    knob.used = 930
    oom.sample()
    assert oom.ready
    oom.admit()
    actions = [a.action for a in oom.history]
    assert actions.index("drain_start") < actions.index("reject") < actions.index("drain_end")
    assert oom.rejected == 1
    assert "1 request(s) were rejected" in oom.history[actions.index("drain_end")].detail


def test_shed_the_newest_when_memory_still_rises_while_draining():
    knob = Knob(used=975)
    oom = OOMGuard([knob], release=False)
    shed = []
    oom.on_shed(lambda n: shed.append(n) or n)
    oom.sample()
    assert shed == []
    knob.used = 995
    oom.sample()
    assert shed == [1] and oom.shed_requests == 1 and oom.history[-1].action == "shed"


def test_admission_with_bytes_counts_reservations_not_yet_allocated():
    knob = Knob(used=500)
    oom = OOMGuard([knob], release=False)
    a = oom.admit(300)
    b = oom.admit(150)  # 500 + 300 pending + 150 = 95 %: under the shed watermark
    with pytest.raises(Overloaded, match="past the shed watermark") as err:
        oom.admit(100)  # 500 + 450 + 100 would be 105 %
    assert err.value.reason == "projected"
    knob.used += 470  # both took their memory, and a little more
    a.allocated()
    b.close()
    with pytest.raises(Overloaded):  # a fresh read: 97 % is draining
        oom.admit(10)
    assert oom.state.draining


def test_a_failed_signal_is_reported_down_and_the_others_kept():
    good, bad = Knob("cgroup", used=950), Knob("nvml:0")
    bad.error = "NVMLError_GpuIsLost"
    oom = OOMGuard([bad, good], release=False)
    store = Store(good, chunk=100)
    oom.retain(store, reason="s", evict=store.evict)
    oom.sample()
    assert oom.worst.signal == "cgroup" and store.calls and oom.signal_errors["nvml:0"] >= 1
    bad2 = Knob("cgroup")
    bad2.error = "gone"
    only_bad = OOMGuard([bad2])
    only_bad.sample()
    assert only_bad.pressure is None and only_bad.ready  # fail-open: never drains because it cannot see


def test_errors_in_callbacks_and_signals_are_contained():
    knob = Knob(used=950)

    class Broken:
        name, fast = "broken", False

        def read(self):
            raise RuntimeError("boom")

    oom = OOMGuard([Broken(), knob], release=False)

    def bad_evict(need):
        raise KeyError("x")

    holder = type("H", (), {})()
    oom.retain(holder, reason="bad", evict=bad_evict)
    oom.sample()  # no exception
    assert oom.errors["evict callback 'bad'"] == 1 and oom.signal_errors["broken"] == 1
    oom.on_allocate()  # never raises either


def test_drain_for_prestop_waits_for_in_flight_requests():
    oom = OOMGuard([Knob(used=100)])
    oom.request_started()
    t = threading.Timer(0.3, oom.request_finished)
    t.start()
    t0 = time.monotonic()
    out = oom.drain(5.0)
    assert out["drained"] and out["in_flight"] == 0 and 0.25 < time.monotonic() - t0 < 4
    assert not oom.ready and oom.ready_to_stop
    with pytest.raises(Overloaded, match="shutdown"):
        oom.admit()
    oom.request_started()
    late = oom.drain(0.2)
    assert not late["drained"] and late["in_flight"] == 1


def test_drain_waits_for_an_idle_check_too():
    oom = OOMGuard([Knob()])
    calls = []
    out = oom.drain(5.0, idle=lambda: calls.append(1) or len(calls) >= 3, poll=0.01)
    assert out["drained"] and len(calls) == 3


def test_guard_retain_with_evict_registers_without_keeping_the_cache_alive():
    guard = Guard()

    class Cache:
        def __init__(self):
            self.evicted = 0

        def evict(self, need):
            self.evicted += 1
            return 0

    c = Cache()
    guard.retain(c, reason="prefix cache", evict=c.evict)
    reg = registry_of(guard)
    assert [r for r, _ in reg.items()] == ["prefix cache"]
    del c
    gc.collect()
    assert reg.items() == []  # the bound method was held weakly; the entry went with the cache


def test_actions_are_ledger_events_and_log_lines(caplog):
    guard = Guard()
    knob = Knob(used=980)
    oom = OOMGuard([knob], release=False).watch_guard(guard, hf_hook=False)
    store = Store(knob, chunk=100)
    guard.retain(store, reason="sessions", evict=store.evict)
    with caplog.at_level("WARNING", logger="kvguardian.ops.oom"):
        oom.sample()
    evs = [e for e in guard.ledger.events() if e.scope == "cache" and e.cache.startswith("oom-guard:")]
    assert [(e.kind, e.cache) for e in evs] == [
        ("pressure", "oom-guard:evict_start"), ("pressure", "oom-guard:drain_start"), ("evict", "oom-guard:evict")]
    assert evs[-1].nbytes == 100
    assert any("crossed the drain watermark" in r.message for r in caplog.records)


def test_ledger_budget_signal_through_watch_guard():
    guard = Guard()
    guard.ledger.add_entry(("x", 1), kind="block", nbytes=950, request=None, source="t")
    oom = OOMGuard().watch_guard(guard, budget_bytes=1000, hf_hook=False)
    oom.sample()
    assert oom.worst.signal == "kv_budget" and oom.pressure == 0.95


def test_the_pool_allocate_path_samples():
    pool = PagedKVPool(32, 16)
    oom = OOMGuard([Knob()], allocate_gap=0.0).watch_pool(pool)
    pool.open("a", "t")
    pool.append("a", list(range(40)))
    pool.allocate_blocks("a", 2)
    assert oom.samples["allocate"] == 2
    pool.append("a", [1])  # fits in the last block: no allocation, no sample
    assert oom.samples["allocate"] == 2


def test_metrics_are_the_catalogs_oom_families():
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from kvguardian.ops.oom.metrics import OOMCollector

    bad = Knob("nvml:0")
    bad.error = "lost"
    oom = OOMGuard([Knob(used=980), bad], release=False)
    oom.sample()
    reg = CollectorRegistry()
    reg.register(OOMCollector(oom))
    text = generate_latest(reg).decode()
    fams = {m.name for m in OOMCollector(oom).collect()}
    assert {n.removesuffix("_total") for n in names("oom")} == fams
    assert 'kvguardian_memory_pressure_ratio{signal="cgroup"} 0.98' in text
    assert 'kvguardian_memory_signal_up{signal="nvml:0"} 0.0' in text
    assert "kvguardian_oom_draining 1.0" in text and "kvguardian_oom_ready 0.0" in text


def test_sampling_thread_reacts_without_any_allocation():
    knob = Knob(used=100)
    with OOMGuard([knob], interval=0.01) as oom:
        knob.used = 990
        deadline = time.monotonic() + 5
        while oom.ready and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not oom.ready and oom.samples["interval"] > 0


def test_interval_must_be_positive():
    from kvguardian.core.errors import UsageError

    with pytest.raises(UsageError, match="positive"):
        OOMGuard(interval=0)
    with pytest.raises(UsageError):
        OOMGuard(watermarks=Watermarks(evict=0.5, drain=0.4))


def test_for_process_reads_the_budget_from_the_environment(monkeypatch):
    from kvguardian.core.errors import UsageError

    monkeypatch.setenv("NV_GPU_KV_CACHE_MB", "64")
    guard = Guard()
    oom = OOMGuard.for_process(guard)
    budget = [s for s in oom.signals if s.name == "kv_budget"]
    assert len(budget) == 1 and budget[0].budget == 64 << 20 and "NV_GPU_KV_CACHE_MB" in budget[0].source
    assert all(s.name != "cgroup" or s.read().limit is not None for s in oom.signals)  # unlimited: left out
    monkeypatch.setenv("KVG_KV_BUDGET_MB", "0")
    with pytest.raises(UsageError, match="admits nothing"):
        OOMGuard.for_process(guard)
