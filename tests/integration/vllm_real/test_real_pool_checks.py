"""Each check of the audit on vLLM 0.32's real KV cache manager (pool_checks.py, run with .venv-vllm's
interpreter): clean use gives nothing; a lost free, a double free, ref-count drift, a miscounted free queue
and a prefix hash without the salt each give their finding; a failing check never reaches vLLM; an unknown
vLLM version is refused with one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def results(vllm_python):
    proc = subprocess.run([str(vllm_python), str(HERE / "pool_checks.py")], capture_output=True, text=True,
                          timeout=600, cwd=HERE.parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def ids(scenario):
    return sorted(f["id"] for f in scenario["findings"])


def test_clean_use_with_prefix_sharing_and_an_abort_gives_nothing(results):
    r = results["clean"]
    assert r["findings"] == [] and r["shared_ref_counts"] == [2, 2, 2] and r["hits"] == 12
    m = r["metrics"]
    assert m["blocks_free"] + m["blocks_cached"] + m["blocks_referenced"] == m["blocks_total"] == 16


def test_lost_free_names_the_request_and_its_blocks(results):
    r = results["lost_free"]
    (f,) = r["findings"]
    assert f["id"] == "KVG204" and f["evidence"]["request_id"] == "kept" and f["evidence"]["blocks"] == r["blocks"]
    assert f["evidence"]["status"] == "FINISHED_ABORTED" and r["usage"] > 0


def test_double_free_is_caught_at_the_free_and_by_the_audit(results):
    r = results["double_free"]
    assert ids(r) == ["KVG201", "KVG201", "KVG203", "KVG206"] and r["ref_cnt_after"] == -1
    at_free = next(f for f in r["findings"] if f["id"] == "KVG201" and "in one call" in f["message"])
    assert at_free["evidence"]["blocks"] == [r["victim"]]


def test_ref_count_drift_and_a_miscounted_free_queue(results):
    (f,) = results["drift"]["findings"]
    assert f["id"] == "KVG203" and f["evidence"]["blocks"] == [results["drift"]["block"]]
    (g,) = results["queue_count"]["findings"]
    assert g["id"] == "KVG206" and g["evidence"]["queue_count"] == g["evidence"]["queue_linked"] - 1


def test_a_hash_without_the_salt_shares_blocks_across_tenants(results):
    r = results["salt_ignored"]
    (f,) = r["findings"]
    assert f["id"] == "KVG205" and f["evidence"]["request_id"] == "bob" and r["hits"] > 0
    assert "a prefix-cache hit gave it" in f["message"] and "tenant-a" not in json.dumps(f)
    assert r["with_salt"] == {"findings": [], "hits": 0}


def test_a_failing_check_never_reaches_vllm(results):
    r = results["fail_open"]
    assert r["errors"] == 1 and r["referenced_after"] == 0 and r["free_after"] == 16 and r["findings"] == ["KVG100"]


def test_an_unknown_vllm_version_is_refused_with_one_line(results):
    r = results["unknown_version"]
    lines = r["stderr"].strip().splitlines()
    assert len(lines) == 1 and "vLLM 0.99.0 is not a version" in lines[0] and r["patched"] is False
