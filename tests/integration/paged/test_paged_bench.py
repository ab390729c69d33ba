import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_bench_pool_writes_json(tmp_path):
    out = tmp_path / "pool.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "pool.py"), "--quick", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=600)
    data = json.loads(out.read_text())
    assert set(data["batch_allocate_free"]) == {"16", "64", "256", "1024", "4096"}
    for row in data["batch_allocate_free"].values():
        assert row["allocate_ns_per_block"] > 0 and row["baseline_free_ns_per_block"] > 0
    assert data["audit_1m"]["num_blocks"] == 1_000_000 and data["audit_1m"]["blocks_referenced"] == 960_000
    assert set(data["targets"]) >= {"allocate_free_le_100ns_at_batch_1024", "audit_1m_le_50ms"}
