"""The guard without a model: requests, custom tensors, and the torch-free core (model tests: integration/)."""

import subprocess
import sys

import pytest
import torch

from kvguardian.core.errors import UsageError
from kvguardian.runtime.guard import Guard


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


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"holder_search_seconds": -1}, "holder_search_seconds"),
    ({"holder_search_seconds": 0}, "holder_search_seconds"),
    ({"holder_search_seconds": float("nan")}, "holder_search_seconds"),
    ({"holder_search_seconds": float("inf")}, "holder_search_seconds"),
    ({"holder_search_seconds": "3"}, "holder_search_seconds"),
    ({"event_capacity": 0}, "event_capacity"),
    ({"event_capacity": 2.5}, "event_capacity"),
    ({"event_capacity": True}, "event_capacity"),
    ({"growth_alpha": 0}, "growth_alpha"),
    ({"growth_alpha": 1}, "growth_alpha"),
    ({"growth_alpha": -0.1}, "growth_alpha"),
    ({"reuse_window": 0}, "reuse_window"),
    ({"reuse_seconds": -5}, "reuse_seconds"),
    ({"strict": "false"}, "strict"),
    ({"redact": 1}, "redact"),
    ({"retention_sampling": None}, "retention_sampling"),
])
def test_wrong_arguments_are_one_line_naming_the_argument_and_the_fix(kwargs, named):
    with pytest.raises(UsageError) as bad:
        Guard(**kwargs)
    text = str(bad.value)
    assert "\n" not in text
    assert text.startswith(f"Guard({named}=") and f"{named} must be" in text
    assert f"fix: e.g. Guard({named}=" in text
    fix = text.split("fix: e.g. ", 1)[1]
    ok = eval(fix, {"Guard": Guard})  # the example given is accepted
    assert isinstance(ok, Guard)


def test_right_arguments_are_accepted():
    g = Guard(strict=True, event_capacity=1, holder_search_seconds=0.5, redact=True, growth_alpha=0.5,
              reuse_window=1, reuse_seconds=1e-3, retention_sampling=True)
    assert g.holder_search_seconds == 0.5 and g.reuse_seconds == 1e-3
