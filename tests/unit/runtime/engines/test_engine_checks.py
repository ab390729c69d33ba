"""The vLLM idle check and the SGLang conservation check, fed the engines' exact exposition text."""

import pytest
from prometheus_client import generate_latest

from engine_fakes import SglangMetrics, VllmMetrics
from kvguardian.core.errors import UsageError
from kvguardian.runtime.engines.board import FindingBoard
from kvguardian.runtime.engines.promtext import ScrapeError, parse
from kvguardian.runtime.engines.sglang_metrics import SglangConservationCheck
from kvguardian.runtime.engines.vllm_metrics import VllmMetricsCheck


def page(fake):
    return parse(generate_latest(fake.registry).decode())


def test_vllm_usage_while_idle_past_grace_is_kvg207_and_resolves():
    board, vllm = FindingBoard(), VllmMetrics(num_gpu_blocks=1001, block_size=16)
    check = VllmMetricsCheck(board, grace=30)
    vllm.set(running=0, waiting=0, usage=0.02)
    check.observe(page(vllm), now=100.0)
    check.observe(page(vllm), now=129.0)
    assert not board.active() and check.idle_seconds(129.0) == 29.0  # still inside the grace period
    check.observe(page(vllm), now=131.0)
    (f,) = board.active()
    assert f.id == "KVG207" and f.severity.value == "warning"
    assert f.evidence["blocks_held"] == 20 and f.evidence["tokens_held"] == 320  # 0.02 * (1001 - 1) blocks of 16
    assert f.evidence["engine_labels"] == {"engine": "0", "model_name": "tiny-llama"}
    vllm.set(running=0, waiting=0, usage=0.0)
    check.observe(page(vllm), now=140.0)
    assert not board.active() and board.all()[0].evidence["resolved_after_seconds"] == 9.0


@pytest.mark.parametrize(("running", "waiting"), [(1, 0), (0, 3)])
def test_vllm_usage_with_work_is_not_a_finding(running, waiting):
    board, vllm = FindingBoard(), VllmMetrics()
    check = VllmMetricsCheck(board, grace=0)
    vllm.set(running=running, waiting=waiting, usage=0.7)
    for t in range(5):
        check.observe(page(vllm), now=float(t))
    assert not board.all()


def test_vllm_sawtooth_of_bursts_never_reaches_grace():
    board, vllm = FindingBoard(), VllmMetrics()
    check = VllmMetricsCheck(board, grace=10)
    for t in range(0, 120, 2):
        busy = (t // 6) % 2 == 0
        vllm.set(running=2 if busy else 0, waiting=0, usage=0.5 if busy else 0.0)
        check.observe(page(vllm), now=float(t))
    assert not board.all()


def test_vllm_sleep_and_wake_transitions():
    vllm = VllmMetrics()
    check = VllmMetricsCheck(FindingBoard())
    assert check.observe(page(vllm), 0.0) == []
    vllm.set_sleep("weights_offloaded")
    assert [k for k, _ in check.observe(page(vllm), 1.0)] == ["sleep"]
    vllm.set_sleep("awake")
    assert [k for k, _ in check.observe(page(vllm), 2.0)] == ["wake"]
    assert check.capacity_blocks() == 1001


def test_wrong_server_is_one_clear_usage_error():
    with pytest.raises(UsageError, match="has no vllm:kv_cache_usage_perc"):
        VllmMetricsCheck(FindingBoard()).observe(page(SglangMetrics()), 0.0)
    with pytest.raises(UsageError, match="lacks sglang:max_total_num_tokens"):
        SglangConservationCheck(FindingBoard()).observe(page(VllmMetrics()), 0.0)
    with pytest.raises(ScrapeError) as exc:
        parse("this is { not metrics\n")
    assert exc.value.reason == "parse"


def test_sglang_over_count_needs_confirmation_then_is_an_error():
    board, sg = FindingBoard(), SglangMetrics(total=10_000)
    check = SglangConservationCheck(board, grace=60, confirm=2)
    sg.set(available=9_800, evictable=500, used=0, running=1, queued=0)
    check.observe(page(sg), 0.0)
    assert not board.active()  # one torn scrape is not proof
    check.observe(page(sg), 5.0)
    (f,) = board.active()
    assert f.id == "KVG206" and f.severity.value == "error" and f.evidence["excess_tokens"] == 300
    sg.set(available=9_500, evictable=500, used=0, running=1, queued=0)
    check.observe(page(sg), 10.0)
    assert not board.active()


def test_sglang_tokens_held_while_idle_is_a_leak_after_grace():
    board, sg = FindingBoard(), SglangMetrics(total=10_000)
    check = SglangConservationCheck(board, grace=20)
    sg.set(available=9_000, evictable=500, used=256, running=0, queued=0)
    check.observe(page(sg), 0.0)
    check.observe(page(sg), 19.0)
    assert not board.active()
    check.observe(page(sg), 21.0)
    (f,) = board.active()
    assert "256 tokens are locked as used" in f.message and f.evidence["unaccounted_tokens"] == 244
    assert check.max_unaccounted() == 244


def test_sglang_busy_protected_tokens_and_idle_eviction_are_healthy():
    board, sg = FindingBoard(), SglangMetrics(total=10_000)
    check = SglangConservationCheck(board, grace=0)
    for t in range(40):
        if t % 10 < 5:  # busy: 1,000 tokens protected (locked radix nodes) are not exported, that is fine
            sg.set(available=6_000, evictable=500, used=2_500, running=3, queued=1)
        else:  # idle: the radix cache is evicted and refilled, the states add up exactly
            sg.set(available=10_000 - 100 * t, evictable=100 * t, used=0, running=0, queued=0)
        check.observe(page(sg), float(t))
    assert not board.all()
