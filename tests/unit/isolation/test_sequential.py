"""The sequential test's guarantees, checked by simulation (pure Python, seeded)."""

from __future__ import annotations

import random

import pytest

from kvguardian.isolation.sequential import SequentialTest


def run(rng, hit, miss, **kw):
    t = SequentialTest(**kw)
    while not t.done:
        t.add(hit(rng), miss(rng))
    return t


def lognormal(mu, sigma):
    return lambda rng: rng.lognormvariate(mu, sigma)


def test_false_sharing_rate_is_at_most_alpha_under_any_null_noise():
    # no sharing, drifting heavy-tailed noise: hit and miss times are exchangeable within each round
    rng = random.Random(1)
    alpha, runs = 0.05, 2000
    false = 0
    for i in range(runs):
        drift = 1 + (i % 7) / 3
        t = run(rng, lambda r, d=drift: d * r.paretovariate(1.5), lambda r, d=drift: d * r.paretovariate(1.5),
                alpha=alpha, beta=0.05, max_samples=200)
        false += t.verdict is True
    assert false / runs <= alpha  # Ville: P(ever crossing 1/alpha) <= alpha (observed ~0.01)


def test_false_clean_rate_is_at_most_beta_when_sharing_is_at_the_minimum_effect():
    rng = random.Random(2)
    beta, runs = 0.05, 2000
    false = 0
    for _ in range(runs):  # miss/hit is exactly min_effect in median: the null of the clean e-process
        t = run(rng, lambda r: 1.0, lambda r: 1.5 * r.lognormvariate(0, 0.5), alpha=1e-3, beta=beta,
                max_samples=200)
        false += t.verdict is False
    assert false / runs <= beta


@pytest.mark.parametrize("ratio", [3.0, 10.0])
def test_strong_sharing_is_detected_in_few_rounds(ratio):
    rng = random.Random(3)
    for _ in range(50):
        t = run(rng, lognormal(0, 0.2), lambda r: ratio * r.lognormvariate(0, 0.2))
        assert t.verdict is True and t.samples <= 24 and t.p_value <= 1e-3


def test_no_sharing_is_certified_in_few_rounds():
    rng = random.Random(4)
    for _ in range(50):
        t = run(rng, lognormal(0, 0.1), lognormal(0, 0.1))
        assert t.verdict is False and t.samples <= 24 and t.p_value_effect <= 1e-3


def test_a_small_effect_in_heavy_noise_stays_undecided_at_the_cap():
    rng = random.Random(5)
    t = run(rng, lognormal(0, 1.0), lambda r: 1.2 * r.lognormvariate(0, 1.0), max_samples=20)
    assert t.verdict is None and t.samples == 20
    s = t.summary()
    assert s["decision"] == "undecided" and 0 < s["p_value"] <= 1 and s["samples"] == 20


def test_ties_move_nothing_and_summary_has_the_effect():
    t = SequentialTest()
    t.add(0.1, 0.1)
    assert t.max_e_share == 1.0 and t.verdict is None
    t.add(0.01, 0.1)
    s = t.summary()
    assert s["samples"] == 2 and s["hit_faster"] == 1 and s["ttft_ratio"] == pytest.approx(0.055 / 0.1)


@pytest.mark.parametrize("kw", [{"alpha": 0}, {"alpha": 0.5}, {"beta": 1}, {"min_effect": 1.0},
                                {"max_samples": 0}])
def test_bad_parameters(kw):
    from kvguardian.core.errors import UsageError

    with pytest.raises(UsageError):
        SequentialTest(**kw)
