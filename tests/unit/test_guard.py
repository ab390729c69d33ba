"""The guard without a model: requests, custom tensors, and the torch-free core (model tests: integration/)."""

import subprocess
import sys

import pytest
import torch

from kvguardian._errors import UsageError
from kvguardian.guard import Guard


def test_requests_do_not_nest_and_ids_are_checked():
    guard = Guard(strict=True)
    with guard.request("a"), pytest.raises(UsageError, match="inside request 'a'"), guard.request("b"):
        pass
    with pytest.raises(UsageError, match="non-empty string"), guard.request(""):
        pass
    with pytest.raises(UsageError, match="needs a reason"):
        guard.retain(object(), reason="")
    with guard.request("a"):  # ended: the id can be used again
        assert guard.current_request().request_id == "a"
    assert guard.current_request() is None


def test_track_for_custom_models():
    g = Guard(strict=True)
    k_buf = torch.zeros(1, 2, 64, 8)  # a preallocated buffer, written in place
    with g.request("custom"):
        for step in range(4):
            k_buf[:, :, step] = 1.0
            g.track(k_buf, k_buf * 2, layer=0)
    snap = g.snapshot()
    k = [r for r in snap.records if r.kind == "k"]
    assert len(k) == 1 and k[0].source == "track" and k[0].request_id == "custom"
    assert snap.event_counts["append"] >= 3


def test_summary_and_check_import_neither_torch_nor_transformers():
    """A guard for a pool or a Redis sweep never touches torch: its summary (reuse rates included) and check work
    without building the transformers source."""
    code = (
        "import sys, kvguardian\n"
        "g = kvguardian.Guard()\n"
        "s = g.summary()\n"
        "assert s['reuse']['by_count']['requests'] == 0 and 'hf' not in s, s\n"
        "r = g.check()\n"
        "assert r.findings == [], r.findings\n"
        "g.reuse_rate(last=5); g.events(); g.detach()\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
