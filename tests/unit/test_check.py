"""The check pipeline over a request scope and its sources, without a guard: settle and snapshot, holder chains
(seeded by the sources), retention verdicts, detectors, report."""

import torch

from kvguardian.core.ledger import EntrySite, Ledger
from kvguardian.runtime.check import CheckOptions, run_check
from kvguardian.runtime.retention import RetentionMonitor
from kvguardian.runtime.sources.scope import RequestScope

KEPT = []  # a module global that keeps request KV: the holder-chain root


class SeedingSource:
    """A source that knows which object holds its entries, and says so through chain_seeds."""

    def __init__(self, holder, log):
        self.holder = holder
        self.log = log

    def end_manual(self):
        self.log.append("end_manual")

    def request_ending(self, info):
        pass

    def request_ended(self, info):
        pass

    def sync(self):
        self.log.append("sync")

    def cache_ref(self, rec):
        return None

    def chain_seeds(self, records):
        self.log.append("seeds")
        return {r.key: self.holder for r in records}, {r.key: ["Holder.kv", "Tensor"] for r in records}


def test_pipeline_order_chains_and_findings():
    scope = RequestScope(Ledger())
    log = []
    holder = type("Holder", (), {})()
    holder.kv = torch.zeros(2, 8)
    scope.add_source(SeedingSource(holder, log))
    retention = RetentionMonitor(scope)
    with scope.request("r1", tenant="t"):
        scope.ledger.observe(holder.kv, EntrySite("k", 0, "test"), scope.current_request())
    KEPT.append(holder)
    del holder
    log.clear()
    try:
        report = run_check(scope, retention, CheckOptions(end_implicit=True),
                           lambda snap: {"entries": len(snap.records)})
    finally:
        KEPT.clear()
    assert log == ["end_manual", "sync", "seeds"]
    assert report.summary == {"entries": 1}
    [f] = report.findings
    assert f.id == "KVG102" and f.evidence["request_id"] == "r1"
    assert f.holder_chain[0] == "module test_check: KEPT" and f.holder_chain[-2:] == ["Holder.kv", "Tensor"]
    assert f.severity.value == "info"  # one owner, held by a single reference: bounded


def test_no_holder_chains_when_not_asked():
    scope = RequestScope(Ledger())
    t = torch.zeros(4)
    with scope.request("r"):
        scope.ledger.observe(t, EntrySite("k", 0, "test"), scope.current_request())
    report = run_check(scope, RetentionMonitor(scope), CheckOptions(holder_chains=False), lambda snap: {})
    [f] = report.findings
    assert f.id == "KVG102" and f.holder_chain is None and f.severity.value == "error"


def test_sampling_is_one_thread_at_a_time_and_capped_in_time(monkeypatch):
    """Requests ending in several threads at once: one samples, the others only count (a second concurrent
    search stalled a threaded server for minutes); each sample's search is capped in wall time."""
    import threading

    from kvguardian.runtime import retention as R

    scope = RequestScope(Ledger())
    mon = RetentionMonitor(scope, sampling=True, max_seconds=3.0)
    assert mon.max_seconds == 3.0 and RetentionMonitor(scope, max_seconds=600).max_seconds == R._SAMPLE_SECONDS
    inside, release, calls = threading.Event(), threading.Event(), []

    def slow(host):
        calls.append(threading.current_thread().name)
        inside.set()
        release.wait(10)

    monkeypatch.setattr(mon, "_sample", slow)
    mon._next_threshold = 1
    t = threading.Thread(target=mon.after_request_end, args=(None,), name="first")
    t.start()
    assert inside.wait(10)
    mon._next_threshold = 1
    mon.after_request_end(None)  # due too, but the first thread is sampling: returns at once
    release.set()
    t.join(10)
    assert calls == ["first"] and mon._ended == 2
