"""KVG103 targets on synthetic series: a one-layer-per-request leak is flagged within 16 requests;
1,000 clean requests with noisy but bounded retention (a bounded prefix cache) give no false positive."""

import numpy as np
import pytest

from kvguardian.core.detectors.growth import mann_kendall, theil_sen, trend_test

LAYER_KV = 2 * 1 * 2 * 64 * 16 * 4  # k+v of one layer: batch 1, 2 KV heads, 64 tokens, head dim 16, fp32


def first_flag(series):
    for n in range(2, len(series) + 1):
        if trend_test(series[:n]).growing:
            return n
    return None


def bounded_prefix_cache(rng, n, capacity=4, prefixes=12, layers=2, zipf=True):
    """Retained bytes of a bounded LRU of prefix caches (system prompts of 32-96 tokens, popularity ∝ 1/rank
    or uniform), plus a few storages not yet freed at each sample. Fills quickly, then churns."""
    sizes = rng.integers(32, 96, size=prefixes) * 2 * layers * 2 * 16 * 4
    weights = 1.0 / np.arange(1, prefixes + 1) if zipf else np.ones(prefixes)
    weights = weights / weights.sum()
    lru: list[int] = []
    out = []
    for _ in range(n):
        p = int(rng.choice(prefixes, p=weights))
        if p in lru:
            lru.remove(p)
        lru.append(p)
        del lru[:-capacity]
        transient = rng.integers(0, 3) * LAYER_KV  # a few storages not yet freed at the sample
        out.append(float(sum(sizes[q] for q in lru) + transient))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_leak_of_one_layer_per_request_flagged_within_16(seed):
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 0.5 * LAYER_KV, size=64)
    series = [float(i * LAYER_KV + 50 * LAYER_KV + noise[i]) for i in range(64)]
    n = first_flag(series)
    assert n is not None and n <= 16
    res = trend_test(series[:16])
    assert res.growing and res.confidence > 0.999
    assert res.slope == pytest.approx(LAYER_KV, rel=0.3)


@pytest.mark.parametrize("seed", range(5))
def test_no_false_positive_over_1000_clean_requests(seed):
    rng = np.random.default_rng(100 + seed)
    series = bounded_prefix_cache(rng, 1000)
    for n in range(2, 1001):
        assert not trend_test(series[:n]).growing, f"false positive at request {n}"


def test_leak_on_top_of_bounded_cache_is_still_found():
    rng = np.random.default_rng(7)
    base = bounded_prefix_cache(rng, 200)
    series = [b + i * LAYER_KV for i, b in enumerate(base)]
    n = first_flag(series)
    assert n is not None and n <= 96


def test_flat_and_decreasing_series_never_flag():
    assert not trend_test([5.0] * 300).growing
    assert not trend_test([float(300 - i) for i in range(300)]).growing


def test_statistics():
    s, p = mann_kendall(list(range(20)))
    assert s == 190 and p < 1e-6
    assert mann_kendall([3.0, 3.0, 3.0])[1] == 1.0
    assert theil_sen([0, 2, 4, 6, 100]) == pytest.approx(2.0)
