import numpy as np

from kvguardian.keyspace.stats import TOP_K, PatternStats, bucket_of, quantile


def _probe(rows):
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def test_buckets_are_exact_below_16_and_quantiles_within_ten_percent():
    assert bucket_of(np.arange(16)).tolist() == list(range(16))
    values = np.random.default_rng(0).integers(1, 10**7, size=20_000)
    hist = np.bincount(bucket_of(values), minlength=300)
    for q in (0.5, 0.9):
        est = quantile(hist, q, int(values.max()))
        assert abs(est - np.quantile(values, q)) / np.quantile(values, q) < 0.10
    assert quantile(np.zeros(10, dtype=np.int64), 0.5, 0) is None


def test_add_batch_counts_ttl_cold_types_and_vanished():
    s = PatternStats(cold_after=100)
    s.ensure(3)
    keys = [b"a", b"b", b"c", b"d", b"gone"]
    probe = _probe([[0, 50, -1, 500],      # string, no TTL, cold
                    [0, 70, -1, 5],        # string, no TTL, hot
                    [1, 900, 30_000, 999],  # list with a TTL under a minute
                    [4, 300, -1, 100],     # hash, no TTL, idle exactly at the threshold: cold
                    [-1, -1, -2, -1]])     # vanished
    s.add_batch(np.array([1, 1, 2, 1, 2]), keys, probe)
    r1, r2 = s.row(1), s.row(2)
    assert s.keys_vanished == 1
    assert (r1["keys"], r1["bytes"], r1["no_ttl_keys"], r1["cold_keys"], r1["cold_bytes"]) == (3, 420, 3, 2, 350)
    assert r1["types"] == {"string": 2, "hash": 1} and r1["collection_keys"] == 1
    assert r2["ttl"]["lt_1m"] == 1 and r2["no_ttl_keys"] == 0 and r2["keys"] == 1
    assert r1["idle_s"]["max"] == 500 and r1["example_cold_key"] == b"a"
    assert [t["key"] for t in r1["top_keys"]] == [b"d", b"b", b"a"]


def test_top_keys_keep_the_largest_and_merge_folds_patterns():
    s = PatternStats(cold_after=10)
    s.ensure(3)
    n = 50
    s.add_batch(np.ones(n, dtype=np.int64), [f"k{i}".encode() for i in range(n)],
                _probe([[0, i, -1, 0] for i in range(n)]))
    assert [t["bytes"] for t in s.row(1)["top_keys"]] == list(range(n - 1, n - 1 - TOP_K, -1))
    s.add_batch(np.full(2, 2), [b"big", b"small"], _probe([[0, 10_000, -1, 0], [0, 1, -1, 0]]))
    s.merge(2, 1)
    row = s.row(1)
    assert row["keys"] == n + 2 and row["bytes_max"] == 10_000 and row["top_keys"][0]["key"] == b"big"
    assert s.row(2)["keys"] == 0
    s.add_batch(np.array([2]), [b"late"], _probe([[0, 5, -1, 0]]))  # a batch mined before the merge
    assert s.row(1)["keys"] == n + 3 and s.row(2)["keys"] == 0


def test_idle_buckets_count_every_key_in_its_range():
    st = PatternStats(cold_after=100)
    st.ensure(1)
    idle = [5, 30, 700, 3_000, 200_000, 4_000_000]
    probe = np.array([[0, 100, -1, i] for i in idle], dtype=np.int64)
    st.add_batch(np.zeros(len(idle), dtype=np.int64), [b"k%d" % i for i in range(len(idle))], probe)
    assert st.row(0)["idle_buckets"] == {"lt_1m": 2, "lt_10m": 0, "lt_1h": 2, "lt_1d": 0, "lt_7d": 1, "lt_30d": 0,
                                         "ge_30d": 1}
    lfu = PatternStats(cold_after=0, idle_metric="freq")
    lfu.ensure(1)
    assert "idle_buckets" not in lfu.row(0)  # LFU counters are not times


def test_unknown_idle_times_are_unknown_not_zero():
    """-1 is an idle time nobody knows (an RDB written without an LRU/LFU policy, OBJECT refused): such keys are
    left out of the idle statistics, which are None where no key of the pattern had one (never "-1s")."""
    st = PatternStats(cold_after=100)
    st.ensure(2)
    probe = _probe([[0, 10, -1, -1], [0, 20, -1, -1], [0, 30, -1, -1], [0, 40, -1, 7], [0, 50, -1, 900]])
    st.add_batch(np.array([0, 0, 0, 1, 1]), [b"a", b"b", b"c", b"d", b"e"], probe)
    unknown, mixed = st.row(0), st.row(1)
    assert unknown["idle_s"] == {"p50": None, "p90": None, "max": None} and "idle_buckets" not in unknown
    assert unknown["cold_keys"] == 0 and all(t["idle_s"] is None for t in unknown["top_keys"])
    assert mixed["idle_s"]["max"] == 900 and sum(mixed["idle_buckets"].values()) == 2
    partly = PatternStats(cold_after=100)
    partly.ensure(1)
    partly.add_batch(np.zeros(3, dtype=np.int64), [b"x", b"y", b"z"], _probe([[0, 1, -1, -1], [0, 1, -1, 5],
                                                                              [0, 1, -1, 6]]))
    row = partly.row(0)
    assert sum(row["idle_buckets"].values()) == 2 and row["idle_s"]["p50"] in (5, 6)  # the known ones only


def test_the_no_ttl_example_is_a_key_without_a_ttl():
    import numpy as np

    from kvguardian.keyspace.stats import PatternStats

    s = PatternStats(cold_after=10)
    s.ensure(2)
    probe = np.array([[0, 50, 1000, 1], [0, 50, -1, 1], [0, 50, -1, 1]], dtype=np.int64)  # pttl 1000: a TTL
    s.add_batch(np.array([1, 1, 1]), [b"with-ttl", b"no-ttl-1", b"no-ttl-2"], probe)
    row = s.row(1)
    assert row["example_key"] == b"with-ttl" and row["example_no_ttl_key"] == b"no-ttl-1"
