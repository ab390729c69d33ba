"""Custom torch models: guard.track() and a gpt-fast-style model with preallocated KV buffers."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from kvguardian.core.errors import UsageError
from kvguardian.runtime.guard import Guard

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "gpt_fast_audit.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("gpt_fast_audit", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpt_fast_audit"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpt_fast_audit", None)


def test_gpt_fast_buffers_found_via_modules_and_accounted(example, capsys):
    assert example.main(["--requests", "3"]) == 0
    out = capsys.readouterr().out
    import json

    data = json.loads(out)
    assert data["findings"] == {} and data["worst"] is None
    assert data["static"]["allocated_bytes"] == 2 * 2 * 4 * 64 * 16 * 4
    assert data["static"]["fragmentation_ratio"] == pytest.approx(1 - 15 / 64)  # 10 prompt + 5 fed back
    assert data["events"]["hit"] == 8, "each later request reuses the model's buffers (2 layers x k/v x 2)"


def test_gpt_fast_replaced_caches_kept_alive_are_orphaned(example, capsys):
    example.OLD_CACHES.clear()
    assert example.main(["--requests", "4", "--leak"]) == 1
    err = capsys.readouterr().err
    assert err.count("KVG102 (error)") == 3
    assert "OLD_CACHES → list[" in err and "KVCache._buffers → dict['k_cache']" in err
    example.OLD_CACHES.clear()


def test_track_for_tensors_and_bad_input():
    g = Guard()
    k = torch.zeros(1, 2, 4, 8)
    v = torch.zeros(1, 2, 4, 8)
    with g.request("t1"):
        g.track(k, v, layer=0)
    assert {r.kind for r in g.snapshot().records} == {"k", "v"}
    with pytest.raises(UsageError, match=r"track_module\(\) needs a torch\.nn\.Module, got str"):
        g.track_module("model")
    with pytest.raises(UsageError, match="no KV buffer in Linear matches"):
        g.track_module(torch.nn.Linear(2, 2))
