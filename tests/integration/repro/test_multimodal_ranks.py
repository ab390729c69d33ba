"""§2.4 end to end: a tiny LLaVA on 2 real gloo ranks (forked processes), three variants."""

import argparse

import pytest

from kvg_testing import rendered
from kvguardian.apps.repro import multimodal
from kvguardian.apps.repro.vlm import VLM_TINY

SEQUENCES = 3


@pytest.fixture(scope="module")
def data():
    return multimodal.measure(sequences=SEQUENCES, new_tokens=2)


def test_buggy_rank0_keeps_visual_kv_rank1_frees_it(data):
    b = data["variants"]["buggy"]
    per_image = VLM_TINY.visual_kv_bytes()
    assert per_image == 2 * 2 * 64 * 2 * 16 * 4
    assert b["held_bytes_by_rank"]["0"] == [per_image * (i + 1) for i in range(SEQUENCES)]
    assert b["held_bytes_by_rank"]["1"] == [0] * SEQUENCES
    assert b["held_storages_end"] == {"0": 4 * SEQUENCES, "1": 0}


def test_cross_rank_check_names_each_sequence_ranks_and_bytes(data):
    b = data["variants"]["buggy"]
    assert b["kvg106_count"] == SEQUENCES
    by_seq = {f["evidence"]["sequence"]: f for f in b["kvg106"]}
    assert sorted(by_seq) == [f"seq-{i}" for i in range(SEQUENCES)]
    f = by_seq["seq-1"]
    assert f["evidence"]["ranks_holding"] == [0] and f["evidence"]["ranks_released"] == [1]
    assert f["evidence"]["bytes_by_rank"] == {"0": VLM_TINY.visual_kv_bytes(), "1": 0}
    assert f["evidence"]["tokens"] == [VLM_TINY.visual_tokens]
    assert "sequence 'seq-1': KV alive on rank 0" in f["message"]


def test_the_holding_rank_names_the_holder(data):
    b = data["variants"]["buggy"]
    assert b["local_findings_by_rank"]["0"] == {"KVG102": SEQUENCES}
    assert b["local_findings_by_rank"]["1"] == {}
    assert b["holder_chain"][:3] == [
        "module kvguardian.apps.repro.rank_server: RANK_SERVER", "RankServer.store", "VisualKVStore.image_cache",
    ]


@pytest.mark.parametrize("variant", ["broadcast", "refcount"])
def test_both_fixes_are_consistent_and_free_everything(data, variant):
    v = data["variants"][variant]
    assert v["kvg106_count"] == 0
    assert v["held_bytes_by_rank"] == {"0": [0] * SEQUENCES, "1": [0] * SEQUENCES}
    assert v["local_findings_by_rank"] == {"0": {}, "1": {}}


def test_communication_per_sequence(data):
    v = data["variants"]
    embed = VLM_TINY.visual_tokens * VLM_TINY.hidden * 4  # the visual tokens broadcast from the vision rank
    assert v["buggy"]["comm_bytes_per_sequence"] == embed
    assert v["broadcast"]["comm_bytes_per_sequence"] == VLM_TINY.visual_kv_bytes()  # 2 × layers × K/V
    assert v["broadcast"]["collectives_per_sequence"] == 2 * VLM_TINY.layers
    assert v["refcount"]["comm_bytes_per_sequence"] == embed + 8  # plus one int64 all-reduce
    assert v["refcount"]["collectives_per_sequence"] == 2
    assert all(v[k]["comm_ms_per_sequence"] > 0 for k in v)
    assert data["llava_7b_broadcast_bytes_per_sequence"] == 2 * 32 * 576 * 32 * 128 * 2
    assert data["ok"]


def test_render_and_argument_checks(data):
    lines = rendered(multimodal.render, data).splitlines()
    assert any(line.startswith("buggy: after 3 sequences rank 0 holds 12 storages") for line in lines)
    assert lines[-1].endswith("both fixes consistent and leak-free: True")
    from kvguardian.core.errors import UsageError

    with pytest.raises(UsageError, match="--image-size 60"):
        multimodal.run(argparse.Namespace(sequences=2, new_tokens=2, image_size=60, json=False))
