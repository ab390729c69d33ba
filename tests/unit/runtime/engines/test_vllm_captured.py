"""The watcher on frames captured from a real vLLM 0.32 server (tests/fixtures/vllm-0.32-cpu/frames.json, made
by capture.py there): the live stream, a replay exchange in vLLM 0.32's 4-frame shape, a "full" report-mode
re-announcement, evictions, and the clear that sleep/wake publishes with the first step after waking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvguardian.runtime.engines.board import FindingBoard
from kvguardian.runtime.engines.kv_events import (
    AllBlocksCleared,
    DecodeError,
    decode_batch,
    split_frames,
    split_replay_frames,
)
from kvguardian.runtime.engines.prefix_audit import PrefixIndexAudit
from kvguardian.runtime.engines.promtext import parse
from kvguardian.runtime.engines.vllm_metrics import VllmMetricsCheck

CAPTURE = json.loads((Path(__file__).parents[3] / "fixtures" / "vllm-0.32-cpu" / "frames.json").read_text())
LIVE = [[bytes.fromhex(x) for x in m["frames_hex"]] for m in CAPTURE["live"]]
REPLIES = [[bytes.fromhex(x) for x in r] for r in CAPTURE["replay_replies_hex"]]


def batches():
    return [(split_frames(f)[0], decode_batch(split_frames(f)[1])) for f in LIVE]


def test_every_live_frame_decodes_and_sequences_are_consecutive():
    seqs = [seq for seq, _ in batches()]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    for _, batch in batches():
        assert not [e for e in batch.events if isinstance(e, DecodeError)]
    kinds = {type(e).__name__ for _, b in batches() for e in b.events}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


def test_replay_replies_of_vllm_032_have_four_frames_and_an_end_marker():
    assert all(len(r) == 4 and r[0] == b"" for r in REPLIES)  # the shape the old watcher counted as errors
    parsed = [split_replay_frames(r) for r in REPLIES]
    assert parsed[-1] == (-1, b"")
    seqs = [seq for seq, _ in parsed[:-1]]
    assert seqs[0] == CAPTURE["replay_request_start"] and seqs == sorted(seqs)
    live = {split_frames(f)[0]: split_frames(f)[1] for f in LIVE}
    for seq, payload in parsed[:-1]:
        assert payload == live[seq]  # replay returns the very batches published live


@pytest.mark.parametrize(("frames", "seq"), [
    ([b"", b"kv", (5).to_bytes(8, "big"), b"p"], 5),  # vLLM 0.32
    ([b"", (5).to_bytes(8, "big"), b"p"], 5),  # older vLLM, SGLang
    ([b"", b"", (-1).to_bytes(8, "big", signed=True), b""], -1),  # 0.32 end marker
    ([b"", (-1).to_bytes(8, "big", signed=True), b""], -1),  # older end marker
])
def test_both_replay_shapes(frames, seq):
    assert split_replay_frames(frames)[0] == seq


@pytest.mark.parametrize("frames", [[b""], [b"", b"a", b"b", b"c", b"d"], [b"", b"kv", b"\x01", b"p"]])
def test_other_replay_shapes_are_refused(frames):
    with pytest.raises(DecodeError):
        split_replay_frames(frames)


def _feed(audit, items, now=1.0):
    for _, batch in items:
        for ev in batch.events:
            audit.apply(ev, now)
        audit.evaluate(now)


def test_the_real_stream_has_no_anomaly_and_fits_the_pool():
    board = FindingBoard()
    audit = PrefixIndexAudit(board, capacity_blocks=64)
    peak = 0
    for item in batches():
        _feed(audit, [item])
        peak = max(peak, audit.size())
    assert 0 < peak <= 63 and audit.anomalies.get("duplicate_store", 0) == 0
    assert audit.reannounced == 2  # kv_cache_report_mode "full" re-announced the 2 reused blocks
    assert audit.events["BlockRemoved"] > 0 and not board.all()
    assert set(audit.summary()["events"]) == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


def _split_at_clear():
    items = batches()
    i = next(i for i, (_, b) in enumerate(items) if any(isinstance(e, AllBlocksCleared) for e in b.events))
    return items[:i], items[i]


def _slept_and_woke():
    """The captured stream up to the sleep, then sleep and wake as the metrics show them."""
    before, first_after = _split_at_clear()
    board = FindingBoard()
    audit = PrefixIndexAudit(board, capacity_blocks=64)
    _feed(audit, before)
    audit.note_sleep(2.0)
    audit.note_wake(3.0)  # the metrics show the engine awake; the clear has not been published yet
    assert not board.all()
    return board, audit, first_after


def test_sleep_and_wake_as_vllm_publishes_them_is_not_stale():
    board, audit, first_after = _slept_and_woke()
    _feed(audit, [first_after], now=4.0)  # the first step after waking carries the clear
    assert not board.all() and audit.clears == 1


def test_a_wake_whose_first_batch_has_no_clear_is_stale():
    board, audit, (seq, batch) = _slept_and_woke()
    stripped = type(batch)(batch.ts, tuple(e for e in batch.events if not isinstance(e, AllBlocksCleared)),
                           batch.dp_rank)
    _feed(audit, [(seq, stripped)], now=4.0)
    (f,) = board.all()
    assert f.id == "KVG105" and "first event batch after wake-up" in f.message


def test_the_real_metrics_page_gives_pool_size_block_size_and_prefix_counters():
    check = VllmMetricsCheck(FindingBoard(), grace=0)
    check.observe(parse(CAPTURE["metrics_after"]), 0.0)
    assert check.capacity_blocks() == 64 and check.block_size() == 128
    assert check.prefix_queries > check.prefix_hits > 0
