import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.slow
def test_bench_pool_writes_json(tmp_path):
    """A quick run without vLLM: every case at every size, the aged pool, the ownership layer, the audit."""
    out = tmp_path / "pool.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "pool.py"), "--quick", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=900)
    data = json.loads(out.read_text())
    rows = {(r["case"], r["n"]) for r in data["comparison"]}
    for case in ("allocate", "free", "allocate_evicting", "free_cached", "prefix_lookup", "match_prefix"):
        assert {n for c, n in rows if c == case} == {1, 4, 16, 64, 256, 1024}, case
    assert all(r["ours_ns"] > 0 and r["vllm_ns"] is None for r in data["comparison"])
    aged = data["aged_vs_fresh"]
    assert {r["case"] for r in aged} == {"allocate", "free", "allocate_evicting", "free_cached"}
    assert all(r["aged_ns"] > 0 and r["fresh_ns"] > 0 for r in aged)
    assert data["audit_1m"]["num_blocks"] == 1_000_000 and data["audit_1m"]["blocks_referenced"] == 960_000
    churned = data["aged_vs_fresh_same_churn"]
    cases = ("allocate_evicting", "free_cached", "free_cached_floor", "free_cached_floor_numpy")
    assert {(r["case"], r["n"]) for r in churned if r["impl"] == "ours"} == {
        (c, n) for c in cases for n in (1, 4, 16, 64, 256, 1024)}
    assert all(r["aged_ns"] > 0 and r["fresh_ns"] > 0 for r in churned)
    assert set(data["targets"]) >= {"aged_within_10pct", "audit_1m_le_50ms", "aged_id_order_worst_ratio",
                                    "aged_lru_order_worst_ratio", "aged_floor_worst_ratio",
                                    "aged_numpy_floor_worst_ratio"}
