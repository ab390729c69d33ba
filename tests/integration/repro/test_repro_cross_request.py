import json

import pytest


@pytest.mark.slow
def test_repro_cross_request_json_reports_divergence_catch_and_timing(kv_cli):
    code, out, err = kv_cli("repro", "cross-request", "--json", "--requests", "12", "--rounds", "1")
    assert code == 0, err
    data = json.loads(out)
    assert data["name"] == "cross-request" and data["section"] == "§2.2" and data["ok"] is True
    checks = data["checks"]
    for bug, first_id in (("buggy stale-free", "KVG201"), ("buggy share-no-cow", "KVG205")):
        v = checks[bug]
        assert v["diverged"] > 0
        assert v["first_fault"]["id"] == first_id
        bad_write = v["first_bad_write"]
        assert bad_write["id"] == "KVG202" and bad_write["operation"] == "write"
        assert bad_write["request_id"].startswith("r-") and isinstance(bad_write["block"], int)
    for fixed in ("strict", "sharing"):
        assert checks[fixed]["diverged"] == 0 and checks[fixed]["faults"] == {} and checks[fixed]["audit"] == []
    assert checks["sharing"]["metrics"]["prefix_hit_rate"] > 0
    t = data["timing"]
    assert set(t["median"]) == {"sharing", "strict", "sharing+checks"} and t["outputs_agree"] is True
    assert t["article_patched_vs_native"]["requests_per_s"] == pytest.approx(116 / 128)
    assert data["article"] == {"native": {"qps": 128.0, "ttft_ms": 42.0}, "patched": {"qps": 116.0, "ttft_ms": 47.0}}
    # ids, counts and hashes only: no token ids or generated tokens in the report
    assert "token_ids" not in out and all("outputs" not in v for v in checks.values())


def test_repro_cross_request_bad_arguments_are_one_line(kv_cli):
    code, out, err = kv_cli("repro", "cross-request", "--requests", "3")
    assert out == ""
    assert code == 2
    assert err.strip().count("\n") == 0 and "--requests 3 is out of range; fix: use 8..512" in err


@pytest.mark.slow
def test_demo_row(kv_cli):
    code, out, err = kv_cli("demo", "--only", "cross-request", "--json")
    assert code == 0, err
    (row,) = json.loads(out)["rows"]
    assert row["name"] == "cross-request" and row["section"] == "§2.2" and row["ok"] is True
    assert row["fix_verified"] is True
    assert "strict 0/24" in row["measured"] and "sharing 0/24" in row["measured"]
    assert "KVG201 at op #" in row["verdict"] and "fixed pools: no finding, audit clean" in row["verdict"]
