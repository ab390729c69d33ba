"""vLLM KV-event decoding (every encoding vLLM shipped, encoded with msgspec as vLLM does) and the prefix audit.

The decoder and the audit are fuzzed: malformed frames, unknown event types, removals of unknown hashes and
duplicate announcements never raise; they are counted.
"""

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_fakes import CLEARED, FORMATS, encode, removed, stored
from kvguardian.runtime.engines.board import FindingBoard
from kvguardian.runtime.engines.kv_events import (
    REASONS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    decode_batch,
    split_frames,
)
from kvguardian.runtime.engines.prefix_audit import PrefixIndexAudit


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_vllm_encoding_decodes_to_the_same_events(fmt):
    batch = decode_batch(encode([stored([11, 12], block_size=4), removed([11]), CLEARED], fmt, ts=12.5))
    assert batch.ts == 12.5 and batch.dp_rank == 0
    s, r, c = batch.events
    assert isinstance(s, BlockStored) and s.block_hashes == (11, 12) and s.parent_block_hash is None
    assert (s.block_size, s.medium, s.group_idx) == (4, "GPU", 0)
    assert s.root_token_digest is not None and s.salt_digest is None
    assert s.has_extra_keys is (fmt != "array")  # extra_keys arrived after the array era
    assert r == BlockRemoved((11,), "GPU", 0)
    assert isinstance(c, AllBlocksCleared)


def test_bytes_hashes_64bit_ints_and_salts_are_kept_as_digests():
    ev = {"type": "BlockStored", "block_hashes": [b"\x01" * 32, 2**64 - 1], "parent_block_hash": None,
          "token_ids": list(range(8)), "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": "ada",
          "extra_keys": [["ada", "tenant-secret-salt"], None]}
    (s,) = decode_batch(msgpack.packb([1.0, [ev], 0])).events
    assert s.block_hashes == (b"\x01" * 32, 2**64 - 1)
    assert s.salt_digest.startswith("salt:") and "tenant" not in s.salt_digest  # the LoRA name is not a salt
    assert s.lora_name == "ada"
    (again,) = decode_batch(msgpack.packb([1.0, [{**ev, "lora_name": None, "extra_keys": [["ada"], None]}], 0])).events
    assert again.salt_digest is not None and again.salt_digest != s.salt_digest


@pytest.mark.parametrize(("frames", "reason"), [
    ([b"", b"\x00" * 8], "frames"),
    ([b"", b"\x00" * 3, b"x"], "sequence"),
])
def test_bad_frames_are_refused_with_a_reason(frames, reason):
    with pytest.raises(DecodeError) as exc:
        split_frames(frames)
    assert exc.value.reason == reason


@pytest.mark.parametrize(("payload", "reason"), [
    (b"\xc1", "payload"),
    (msgpack.packb({"no": "batch"}), "batch"),
    (msgpack.packb([1.0, "events?", 0]), "batch"),
    (msgpack.packb("text"), "batch"),
])
def test_bad_payloads_are_refused_with_a_reason(payload, reason):
    with pytest.raises(DecodeError) as exc:
        decode_batch(payload)
    assert exc.value.reason == reason


def test_bad_events_do_not_lose_their_neighbours():
    good = {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}
    batch = decode_batch(msgpack.packb([1.0, [7, {"type": "Gossip"}, {"type": "BlockRemoved", "block_hashes": "x"},
                                             ["BlockStored", [1], None, [1, 2], 0], good], None]))
    reasons = [e.reason if isinstance(e, DecodeError) else "ok" for e in batch.events]
    assert reasons == ["event", "unknown_type", "field", "field", "ok"]


# ---------------------------------------------------------------------------------------------- fuzzing

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
                     st.text(max_size=8), st.binary(max_size=8))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                       max_leaves=12)
_event_like = st.one_of(
    _values,
    st.fixed_dictionaries({"type": st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Nope"])},
                          optional={"block_hashes": _values, "parent_block_hash": _values, "token_ids": _values,
                                    "block_size": _values, "medium": _values, "extra_keys": _values,
                                    "group_idx": _values, "lora_name": _values}),
    st.lists(st.one_of(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]), _values), max_size=8),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=64),
                 st.builds(lambda ts, evs, r: msgpack.packb([ts, evs, r]), _values, st.lists(_event_like, max_size=6),
                           _values)))
def test_decoder_never_raises_anything_but_decode_error(payload):
    audit = PrefixIndexAudit(FindingBoard(), capacity_blocks=8)
    try:
        batch = decode_batch(payload)
    except DecodeError as exc:
        assert exc.reason in REASONS
        return
    for ev in batch.events:
        if isinstance(ev, DecodeError):
            assert ev.reason in REASONS
        else:
            audit.apply(ev, 0.0)
    audit.evaluate(0.0)
    assert audit.size() == sum(audit.size_by_medium().values())


_ops = st.lists(st.one_of(
    st.tuples(st.just("store"), st.lists(st.integers(0, 12), min_size=1, max_size=4), st.none() | st.integers(0, 12)),
    st.tuples(st.just("remove"), st.lists(st.integers(0, 12), min_size=1, max_size=4), st.none()),
    st.tuples(st.just("clear"), st.just([]), st.none()),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_audit_matches_a_set_model_and_counts_every_anomaly(ops):
    audit = PrefixIndexAudit(FindingBoard(), index_limit=1_000)
    model: set[int] = set()
    dup = unknown = reannounced = 0
    for op, hashes, parent in ops:
        if op == "store":
            audit.apply(BlockStored(tuple(hashes), parent, 4, "GPU", 0, None, None, None, True), 0.0)
            if all(h in model for h in hashes):  # every block known: a re-announcement, not an anomaly
                reannounced += len(hashes)
                continue
            for h in hashes:
                dup += h in model
                model.add(h)
        elif op == "remove":
            audit.apply(BlockRemoved(tuple(hashes), "GPU", 0), 0.0)
            for h in hashes:
                unknown += h not in model
                model.discard(h)
        else:
            audit.apply(AllBlocksCleared(), 0.0)
            model.clear()
    assert audit.size() == len(model)
    assert audit.anomalies["duplicate_store"] == dup
    assert audit.anomalies["removal_of_unknown_hash"] == unknown
    assert audit.reannounced == reannounced


# ---------------------------------------------------------------------------------------------- audit checks


def _store(audit, hashes, parent=None, salt=None, root=b"r", medium="GPU"):
    audit.apply(BlockStored(tuple(hashes), parent, 4, medium, 0, None, salt, root if parent is None else None, True),
                1.0)
    audit.evaluate(1.0)


def test_index_larger_than_the_pool_is_proven_growth_and_resolves_when_removals_arrive():
    board = FindingBoard()
    audit = PrefixIndexAudit(board, capacity_blocks=5)  # 4 cacheable blocks: vLLM never caches its null block
    _store(audit, [1, 2, 3, 4])
    _store(audit, [5, 6, 7], medium="CPU")  # offloaded blocks do not count against the GPU pool
    assert not board.active()
    _store(audit, [8], parent=4)
    (f,) = board.active()
    assert (f.id, f.severity.value) == ("KVG208", "error")
    assert f.evidence["gpu_blocks_in_index"] == 5 and f.evidence["cacheable_blocks"] == 4
    audit.apply(BlockRemoved((1, 2), "GPU", 0), 2.0)
    audit.evaluate(2.0)
    assert not board.active() and board.all()[0].evidence["resolved_after_seconds"] == 1.0


def test_growth_after_lost_events_is_only_suspected():
    board = FindingBoard()
    audit = PrefixIndexAudit(board, capacity_blocks=3)
    audit.mark_incomplete()
    _store(audit, [1, 2, 3])
    assert board.active()[0].severity.value == "warning"


def test_one_prefix_under_many_salts_is_reported_without_the_salts():
    board = FindingBoard()
    audit = PrefixIndexAudit(board, max_salts_per_prefix=4)
    for i in range(3):
        _store(audit, [100 + i], salt=f"salt:{i:012x}", root=b"same-system-prompt")
    _store(audit, [200], salt=None, root=b"same-system-prompt")  # the unsalted namespace counts as one
    (f,) = board.active()
    assert f.id == "KVG208" and f.evidence["max_namespaces_per_prefix"] == 4
    assert audit.namespaces() == 4 and audit.summary()["salted_blocks_in_index"] == 3


def test_chains_inherit_their_first_blocks_namespace():
    audit = PrefixIndexAudit(FindingBoard())
    _store(audit, [1], salt="salt:aaaaaaaaaaaa")
    _store(audit, [2, 3], parent=1)
    _store(audit, [9], parent=777)  # its first block was announced before we subscribed
    assert audit.summary()["salted_blocks_in_index"] == 3
    assert audit.summary()["blocks_of_unknown_namespace"] == 1


def test_sleep_without_clear_is_stale_generation_and_a_clear_resolves_it():
    board = FindingBoard()
    audit = PrefixIndexAudit(board)
    _store(audit, [1, 2])
    audit.note_sleep(5.0)
    audit.note_wake(9.0)
    assert not board.active()  # vLLM publishes the clear at its next step: judged at the next batch
    _store(audit, [7])  # that batch came without a clear
    (f,) = board.active()
    assert f.id == "KVG105" and f.evidence["blocks_in_index"] == 3 and f.evidence["seconds_asleep"] == 4.0
    assert "AllBlocksCleared at the engine's first step" in f.fix and "self" not in f.fix
    audit.apply(AllBlocksCleared(), 10.0)
    assert not board.active() and audit.size() == 0


def test_a_batch_stamped_before_the_sleep_that_comes_after_the_wake_is_not_the_first_after_it():
    """vLLM publishes from a thread: under load its last batch before a sleep arrived after the metrics showed
    the wake, and was judged as the first batch after it (a false KVG105 on a real clean server)."""
    board = FindingBoard()
    audit = PrefixIndexAudit(board)
    _store(audit, [1, 2])
    audit.note_sleep(5.0, wall=1_000.0)
    audit.note_wake(9.0)
    audit.apply(BlockStored((3,), 2, 4, "GPU", 0, None, None, None, True), 9.5)
    audit.evaluate(9.5, batch_ts=999.0)  # published before the sleep was seen
    assert not board.active()
    audit.apply(BlockStored((7,), None, 4, "GPU", 0, None, None, b"r", True), 10.0)
    audit.evaluate(10.0, batch_ts=1_004.0)  # published after the wake, without a clear
    (f,) = board.active()
    assert f.id == "KVG105" and f.evidence["blocks_in_index"] == 4


def test_the_clear_in_the_first_batch_after_wake_is_healthy():
    board = FindingBoard()
    audit = PrefixIndexAudit(board)
    _store(audit, [1, 2])
    audit.note_sleep(5.0)
    audit.note_wake(9.0)  # vLLM: the metrics say awake before the clear is published
    audit.apply(AllBlocksCleared(), 10.0)  # the first step after wake: clear, then the new request's blocks
    _store(audit, [5])
    assert not board.active() and audit.size() == 1


def test_a_wake_without_any_batch_is_judged_only_after_serving_for_the_grace():
    board = FindingBoard()
    audit = PrefixIndexAudit(board, grace=10.0)
    _store(audit, [1, 2])
    audit.note_sleep(5.0)
    audit.note_wake(9.0)
    audit.check_wake(100.0, engine_served=False)  # idle after wake: nothing to judge, however long
    assert not board.active()
    audit.check_wake(15.0, engine_served=True)  # served, but inside the grace
    assert not board.active()
    audit.check_wake(20.0, engine_served=True)
    (f,) = board.active()
    assert f.id == "KVG105" and "no KV event batch arrived" in f.message


def test_sleep_after_a_clear_is_fine():
    board = FindingBoard()
    audit = PrefixIndexAudit(board)
    _store(audit, [1, 2])
    audit.apply(AllBlocksCleared(), 2.0)  # vLLM resets the prefix cache before sleeping
    audit.note_sleep(3.0)
    audit.note_wake(4.0)
    assert not board.active()


def test_index_limit_bounds_the_auditor():
    board = FindingBoard()
    audit = PrefixIndexAudit(board, index_limit=10)
    _store(audit, list(range(25)))
    assert audit.size() == 10 and audit.anomalies["index_full"] == 15
    assert board.active()[0].id == "KVG208"


# ---------------------------------------------------------------------------------------------- the subscriber's logic

_frames = st.one_of(
    st.lists(st.binary(max_size=12), max_size=4),
    st.builds(lambda seq, payload: [b"", seq.to_bytes(8, "big", signed=True), payload],
              st.integers(-2, 40), st.one_of(st.binary(max_size=16), st.builds(
                  lambda evs: encode(evs), st.lists(st.sampled_from([stored([1, 2]), stored([3], parent=2),
                                                                     removed([1, 9]), CLEARED]), max_size=3)))),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_frames, max_size=25))
def test_any_frame_sequence_is_counted_never_raised(frames):
    from kvg_testing import free_port
    from kvguardian.runtime.engines.kv_subscriber import KVEventSubscriber

    board = FindingBoard()
    audit = PrefixIndexAudit(board)
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{free_port()}", audit, board)  # nothing listens: frames fed directly
    try:
        for i, f in enumerate(frames):
            sub.handle([list(f)], float(i))
        decoded = sum(1 for f in frames if len(f) == 3 and len(f[1]) == 8)
        assert sub.batches == decoded
        assert sum(sub.errors.values()) >= len(frames) - decoded
        assert sub.lost >= 0 and audit.size() == sum(audit.size_by_medium().values())
        assert all(f.id == "KVG209" for f in board.active())
    finally:
        sub.close()
