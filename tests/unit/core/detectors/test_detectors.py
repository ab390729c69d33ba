"""Detectors are pure functions of a snapshot: feed them hand-built snapshots."""

from kvguardian.core.detectors import DetectContext, grad_tracked, orphaned, run_all
from kvguardian.core.ledger import EntryState, LedgerSnapshot, Record, RequestInfo
from kvguardian.core.tensors.holders import HolderChain


def rec(eid, rid, state, layer=0, nbytes=100, kind="k"):
    return Record(entry_id=eid, key=1000 + eid, kind=kind, layer=layer, request_id=rid, tenant="t", generation=0,
                  source="DynamicLayer", shape=(1, 2, 4, 8), dtype="torch.float32", device="cpu", logical_bytes=nbytes,
                  storage_bytes=nbytes, created=0.0, last_access=0.0, state=state)


def snap(records=(), grad=(), series=()):
    reqs = {r: RequestInfo(request_id=r, tenant="t", generation=0, started=0.0, ended=1.0)
            for r in {x.request_id for x in records if x.request_id}}
    return LedgerSnapshot(taken=10.0, generation=0, records=tuple(records), requests=reqs,
                          retained_series=tuple(series), grad_observations=tuple(grad), event_counts={},
                          events_dropped=0, instrumentation_errors={}, released_entries=0, released_bytes=0)


def test_orphaned_groups_by_request_and_uses_the_complete_chain():
    records = [rec(1, "a", EntryState.ORPHANED, 0), rec(2, "a", EntryState.ORPHANED, 1),
               rec(3, "b", EntryState.RETAINED), rec(4, "c", EntryState.LIVE)]
    chains = {
        1001: HolderChain(["<unknown holder of list>", "Tensor"], "none", False, notes=["time bound"]),
        1002: HolderChain(["module app: X", "Tensor"], "module", True),
    }
    [f] = orphaned.detect(snap(records), DetectContext(holder_chains=chains))
    assert f.id == "KVG102" and f.evidence["request_id"] == "a"
    assert f.evidence["bytes"] == 200 and f.evidence["layers"] == [0, 1]
    assert f.holder_chain == ["module app: X", "Tensor"] and "held by module app: X" in f.message


def test_orphaned_without_chain_still_reports_bytes():
    [f] = orphaned.detect(snap([rec(1, "a", EntryState.ORPHANED)]), DetectContext())
    assert f.holder_chain is None and f.evidence["holder_complete"] is False


def test_grad_detector_error_unless_cleared():
    chained = {"request_id": "r", "layers": [0], "layer_updates": {0: 3}, "chained_updates": 2,
               "graph_nodes": 10, "saved_bytes": 99, "seq_len_at_detection": 8}
    cleared = {**chained, "request_id": "s", "chained_updates": 0}
    single = {**chained, "request_id": "u", "chained_updates": 0, "layer_updates": {0: 1}}
    findings = grad_tracked.detect(snap(grad=[chained, cleared, single]), DetectContext())
    assert sorted(f.evidence["request_id"] for f in findings) == ["r", "u"]
    assert all(f.severity.value == "error" for f in findings)


def test_growth_detector_reads_the_series():
    series = [(float(i), f"r{i}", 1000 * i) for i in range(20)]
    [f] = [x for x in run_all(snap(series=series), DetectContext()) if x.id == "KVG103"]
    assert f.evidence["slope_bytes_per_request"] == 1000.0 and f.evidence["confidence"] > 0.99999
    (t0, b0), (t1, b1) = f.evidence["trend_line"]  # over the window that fired, for the report's timeline
    assert t1 == 19.0 and b1 == 19_000.0 and b0 == 1000.0 * t0 and t1 - t0 == f.evidence["window_requests"] - 1
    assert run_all(snap(series=[(float(i), "r", 5) for i in range(40)]), DetectContext()) == []


def test_degraded_and_unknown_layout_come_from_the_snapshot():
    from kvguardian.core.detectors import degraded, unknown_layout

    base = snap()
    assert degraded.detect(base, DetectContext()) == [] and unknown_layout.detect(base, DetectContext()) == []
    noted = LedgerSnapshot(
        taken=1.0, generation=0, records=(), requests={}, retained_series=(), grad_observations=(), event_counts={},
        events_dropped=0, instrumentation_errors={"cache.update": 2, "track": 1}, released_entries=0,
        released_bytes=0, unknown_classes={"app.MyCache": "no `layers` list", "MyLayer": "unknown layer class"},
    )
    [kvg100] = degraded.detect(noted, DetectContext())
    assert kvg100.id == "KVG100" and kvg100.evidence == {"errors_by_site": {"cache.update": 2, "track": 1}}
    assert "3 instrumentation error(s)" in kvg100.message
    kvg107 = unknown_layout.detect(noted, DetectContext())
    assert [f.evidence["class"] for f in kvg107] == ["MyLayer", "app.MyCache"]  # sorted
    assert [f.id for f in run_all(noted, DetectContext())] == ["KVG100", "KVG107", "KVG107"]
