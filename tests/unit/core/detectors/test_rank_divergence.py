import torch

from kvguardian.core.detectors.rank_divergence import MAX_FINDINGS, compare, sequence_summary
from kvguardian.runtime.guard import Guard


def summary(rank, seqs, active=()):
    return {"rank": rank, "world_size": 2, "generation": 0, "active": list(active),
            "sequences": {sid: {"bytes": b, "entries": e, "tokens": [64], "layers": [0, 1]}
                          for sid, (b, e) in seqs.items()},
            "total_bytes": sum(b for b, _ in seqs.values())}


def test_kv_alive_on_one_rank_only_names_sequence_ranks_and_bytes():
    findings = compare([summary(1, {}), summary(0, {"seq-3": (32768, 4)})])
    assert len(findings) == 1
    f = findings[0]
    assert f.id == "KVG106" and f.severity.value == "error"
    assert f.message == (
        "sequence 'seq-3': KV alive on rank 0 (rank 0: 32768 bytes in 4 storages; its owner ended) but not on rank 1"
    )
    assert f.evidence["ranks_holding"] == [0] and f.evidence["ranks_released"] == [1]
    assert f.evidence["bytes_by_rank"] == {"0": 32768, "1": 0}


def test_consistent_ranks_give_nothing_and_exact_bytes_is_opt_in():
    same = {"seq-1": (4096, 2)}
    assert compare([summary(0, same, ["seq-1"]), summary(1, same, ["seq-1"])]) == []
    uneven = [summary(0, {"seq-1": (4096, 2)}, ["seq-1"]), summary(1, {"seq-1": (2048, 2)}, ["seq-1"])]
    assert compare(uneven) == []  # tensor-parallel shards may differ in size
    (f,) = compare(uneven, exact_bytes=True)
    assert "ranks hold different KV bytes: rank 0: 4096, rank 1: 2048" in f.message


def test_ended_on_one_rank_active_on_the_other():
    (f,) = compare([summary(0, {"s": (10, 1)}, ["s"]), summary(1, {"s": (10, 1)}, [])])
    assert f.message == "sequence 's' ended on rank 1 but is active on rank 0 while 20 bytes of its KV are held"


def test_findings_are_bounded_and_the_rest_counted():
    many = {f"seq-{i:04d}": (8, 1) for i in range(MAX_FINDINGS + 7)}
    findings = compare([summary(0, many), summary(1, {})])
    assert len(findings) == MAX_FINDINGS
    assert findings[-1].evidence["more_divergent_sequences"] == 7


def test_summary_of_a_real_ledger_counts_live_bytes_per_sequence():
    guard = Guard()
    kept = []
    for sid in ("a", "b"):
        with guard.request(sid):
            k, v = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4)
            guard.track(k, v, layer=0)
            if sid == "a":
                kept.append((k, v))
        del k, v
    s = sequence_summary(guard.snapshot(), rank=0, world_size=2)
    assert set(s["sequences"]) == {"a"}
    assert s["sequences"]["a"]["bytes"] == 2 * 2 * 8 * 4 * 4
    assert s["sequences"]["a"]["entries"] == 2 and s["sequences"]["a"]["tokens"] == [8]
    assert s["sequences"]["a"]["active"] is False and s["active"] == []
