"""The request scope, the host every source talks to: request boundaries reach every source in order, implicit
requests restore the caller's, errors fail open (strict raises), declared retention follows its object."""

import gc

import pytest
import torch

from kvguardian.core import faults as _faults
from kvguardian.core.errors import InstrumentationError, UsageError
from kvguardian.core.ledger import EntrySite, EntryState, Ledger
from kvguardian.runtime.sources import Source, SourceHost
from kvguardian.runtime.sources.scope import RequestScope


class RecordingSource:
    """A source that only records what its host asks of it."""

    def __init__(self, log):
        self.log = log

    def end_manual(self):
        self.log.append("end_manual")

    def request_ending(self, info):
        self.log.append(f"ending {info.request_id}")

    def request_ended(self, info):
        self.log.append(f"ended {info.request_id}")

    def sync(self):
        self.log.append("sync")

    def cache_ref(self, rec):
        return None

    def chain_seeds(self, records):
        return {}, {}


def test_scope_is_a_source_host_and_tells_sources_then_listeners():
    scope: SourceHost = RequestScope(Ledger())
    log = []
    source: Source = RecordingSource(log)
    scope.add_source(source)
    scope.add_listener(lambda info: log.append(f"listener {info.request_id}"))
    with scope.request("r1", tenant="t"):
        assert scope.current_request().tenant == "t"
    assert log == ["end_manual", "ending r1", "ended r1", "listener r1"]
    log.clear()
    scope.snapshot()
    assert log == ["sync"]
    scope.remove_source(source)
    assert scope.sources() == () and source not in scope.auditor_objects()


def test_implicit_requests_restore_the_callers_request():
    scope = RequestScope(Ledger())
    opened = scope.begin_implicit("generate")
    assert scope.current_request() is opened.info and opened.info.implicit
    assert opened.info.request_id == "generate-1"
    scope.end_implicit(opened)
    assert scope.current_request() is None and not opened.info.active
    manual = scope.ledger.begin_request("cache-1", implicit=True)
    scope.end_manual(manual)
    assert not manual.active


def test_errors_fail_open_and_strict_raises():
    scope = RequestScope(Ledger())
    scope.fail("cache.update", RuntimeError("boom"))
    scope.fail("cache.update", RuntimeError("boom"))
    assert scope.ledger.snapshot().instrumentation_errors == {"cache.update": 2}
    strict = RequestScope(Ledger(), strict=True)
    with pytest.raises(InstrumentationError, match=r"cache\.update"):
        strict.fail("cache.update", RuntimeError("boom"))


def test_a_fault_at_request_exit_is_contained():
    scope = RequestScope(Ledger())
    _faults.FAULTS.add("request.exit")
    try:
        with scope.request("r"):
            pass
    finally:
        _faults.FAULTS.clear()
    assert scope.ledger.snapshot().instrumentation_errors == {"request.exit": 1}
    with pytest.raises(UsageError, match="inside request"), scope.request("a"), scope.request("b"):
        pass


def test_declared_retention_follows_its_object():
    scope = RequestScope(Ledger())
    site = EntrySite("k", 0, "test")
    holder = type("Holder", (), {})()
    holder.kv = [torch.zeros(4)]
    with scope.request("r"):
        scope.ledger.observe(holder.kv[0], site, scope.current_request())
    assert scope.retain(holder, reason="prefix cache") == 1
    assert [r.state for r in scope.ledger.records()] == [EntryState.RETAINED]
    extra = torch.zeros(4)  # what the holder lets go of is not retained any more
    with scope.request("r2"):
        scope.ledger.observe(extra, site, scope.current_request())
    old = holder.kv.pop()
    holder.kv.append(extra)
    scope.declared.refresh()
    states = {r.key: r.state for r in scope.ledger.records()}
    assert states == {old.untyped_storage().data_ptr(): EntryState.ORPHANED,
                      extra.untyped_storage().data_ptr(): EntryState.RETAINED}
    del holder, old, extra
    gc.collect()
    scope.declared.refresh()
    assert scope.ledger.records() == []


def test_grad_evidence_is_bounded_per_request():
    scope = RequestScope(Ledger())
    k = torch.zeros(1, 2, 3, 4, requires_grad=True) * 2
    with scope.request("g"):
        for layer in (0, 1, 1):
            scope.note_grad(k, layer)
    [obs] = scope.ledger.snapshot().grad_observations
    assert obs["request_id"] == "g" and obs["layers"] == [0, 1] and obs["layer_updates"] == {0: 1, 1: 2}
    assert obs["graph_nodes"] >= 1 and obs["grad_fn"] == "MulBackward0"
