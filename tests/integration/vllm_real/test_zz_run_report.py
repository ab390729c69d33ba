"""Last of the real-vLLM job (it stops the clean server): `kv-guardian run` merged the vLLM audit into its report."""

from __future__ import annotations

import json


def test_run_merges_the_audit_of_the_clean_server(clean, servers):
    """Last (it stops the clean server): `kv-guardian run` wrote one report with the vLLM audit in it."""
    clean.stop()
    report_path = servers.run_dir / "clean-run-report.json"
    assert report_path.exists(), clean.log_tail()
    report = json.loads(report_path.read_text())
    (audited,) = [p for p in report["summary"]["processes"] if p.get("status") == "vllm-audit"]
    assert audited["vllm_audit"]["audits"] > 0 and audited["vllm_audit"]["requests_finished"] > 0
    assert audited["vllm_audit"]["lost_free_requests"] == [] and report["findings"] == []
