"""The reuse window (count- and time-based) and live KV accounting, on synthetic inputs."""

import pytest
import torch

from kvguardian.core.accounting import kv_accounting, seq_bucket
from kvguardian.core.errors import UsageError
from kvguardian.core.ledger import EntrySite, Ledger, Update
from kvguardian.core.reuse import ReuseWindow


def test_reuse_window_by_count_and_by_time():
    now = [0.0]
    w = ReuseWindow(capacity=8, clock=lambda: now[0])
    for i in range(10):  # a hit every third request
        now[0] = float(i)
        w.add(i % 3 == 0, 30 if i % 3 == 0 else 0, 10)
    last4 = w.rate(last=4)  # requests 6..9: hits at 6 and 9
    assert last4["requests"] == 4 and last4["hits"] == 2 and last4["hit_rate"] == 0.5
    assert last4["token_reuse_rate"] == pytest.approx(60 / (60 + 40))
    recent = w.rate(seconds=2.5)  # ts >= 6.5: requests 7, 8, 9
    assert recent["requests"] == 3 and recent["hits"] == 1
    assert w.rate(last=100)["requests"] == 8, "bounded by capacity"
    assert w.total_requests == 10 and w.total_hits == 4
    assert ReuseWindow().rate(last=5)["hit_rate"] is None
    with pytest.raises(UsageError, match="exactly one of"):
        w.rate(last=3, seconds=1.0)
    with pytest.raises(UsageError, match="must be > 0"):
        w.rate(seconds=0)


def test_seq_bucket():
    assert [seq_bucket(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 1000)] == \
        ["0", "1", "2", "3-4", "3-4", "5-8", "5-8", "9-16", "513-1024"]
    assert seq_bucket(None) == "unknown"


def test_accounting_by_request_tenant_layer_head_and_static_fill():
    led = Ledger()
    a = led.begin_request("a", tenant="t1")
    b = led.begin_request("b", tenant="t2")
    dyn = [torch.zeros(1, 2, 10, 8) for _ in range(2)]  # 640 bytes each
    static = torch.zeros(1, 4, 100, 8)  # 12800 bytes, 25 of 100 tokens filled
    big = torch.zeros(1, 2, 40, 8)
    cropped = big[..., :10, :]  # a cropped view keeps the whole 2560-byte storage alive
    del big
    led.observe(dyn[0], EntrySite(kind="k", layer=0, source="DynamicLayer"), a)
    led.observe(dyn[1], EntrySite(kind="v", layer=0, source="DynamicLayer", role="cross"), a)
    static_site = EntrySite(kind="k", layer=1, source="StaticLayer")
    led.observe(static, static_site, b, Update(filled_tokens=25, capacity_tokens=100))
    led.observe(cropped, EntrySite(kind="v", layer=1, source="DynamicLayer"), b)
    acc = kv_accounting(led.snapshot())
    assert acc["total_bytes"] == 640 * 2 + 12800 + 2560
    assert acc["by_request"] == {"b": 12800 + 2560, "a": 1280}
    assert acc["by_tenant"] == {"t2": 15360, "t1": 1280}
    assert acc["by_role"] == {"decoder": 640 + 12800 + 2560, "cross": 640}
    assert acc["by_layer"]["0"]["bytes"] == 1280 and acc["by_layer"]["0"]["kv_heads"] == 2
    assert acc["by_layer"]["1"]["unused_bytes"] == 12800 * 3 // 4 + 2560 * 3 // 4
    # per KV head: each storage split evenly over its heads
    assert acc["by_kv_head"] == {"0": 640 + 3200 + 1280, "1": 640 + 3200 + 1280, "2": 3200, "3": 3200}
    assert acc["static"] == {"allocated_bytes": 12800, "filled_bytes": 3200, "fragmentation_ratio": 0.75}
    assert acc["cropped_views"] == {"entries": 1, "storage_bytes": 2560, "view_bytes": 640}
    assert acc["by_seq_len"] == {"9-16": 1280 + 2560, "17-32": 12800}
