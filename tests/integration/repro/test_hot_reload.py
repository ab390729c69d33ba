"""§2.5 over real HTTP: FastAPI + uvicorn on a loopback port, driven with httpx."""

import argparse

import httpx
import pytest

from kvg_testing import rendered
from kvguardian.apps.repro import hot_reload
from kvguardian.apps.repro.reload_server import create_app, serve

SYSTEM = "You are a helpful assistant."


def test_endpoints_over_http():
    app = create_app("fixed")
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        assert url.startswith("http://127.0.0.1:")
        r = c.post("/generate", json={"system": SYSTEM, "prompt": "hello", "max_new_tokens": 3})
        assert r.status_code == 200
        body = r.json()
        assert body["generation"] == 0 and len(body["tokens"]) == 3 and body["request_id"] == "r-1"
        assert "hello" not in r.text  # the prompt is never echoed
        kv = c.get("/kv").json()
        assert kv["generation"] == 0 and kv["kv_bytes"] > 0 and kv["models_alive"] == 1
        assert c.post("/reload", json={"seed": 7}).json()["generation"] == 1
        assert c.post("/generate", json={"system": SYSTEM, "prompt": "x", "max_new_tokens": 99}).status_code == 422
        assert c.post("/reload", json={"seed": -1}).status_code == 422
        after = c.get("/kv").json()
        assert after["generation"] == 1 and after["kv_bytes"] == 0 and after["models_alive"] == 1
        assert c.get("/check").json()["findings"] == []


def test_buggy_server_reports_stale_generation_over_http():
    app = create_app("buggy")
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        c.post("/generate", json={"system": SYSTEM, "prompt": "q", "max_new_tokens": 2}).raise_for_status()
        c.post("/reload", json={"seed": 1}).raise_for_status()
        report = c.get("/check").json()
        kv = c.get("/kv").json()
    (f,) = [f for f in report["findings"] if f["id"] == "KVG105"]
    assert f["evidence"]["generation"] == 0 and f["evidence"]["current_generation"] == 1
    assert f["holder_chain"][0] == "class kvguardian.apps.repro.reload_server.LruPrefixService: encode_prefix"
    assert f["holder_chain"][1] == "lru_cache LruPrefixService.encode_prefix()"
    assert kv["models_alive"] == 2 and list(kv["kv_bytes_by_generation"]) == ["0"]
    assert SYSTEM not in str(report)  # reports never contain prompt text


@pytest.fixture(scope="module")
def twenty():
    return hot_reload.measure(reloads=20, requests_per_reload=2)


def test_twenty_reloads_grow_linearly_buggy_and_stay_flat_fixed(twenty):
    b, f = twenty["buggy"], twenty["fixed"]
    kv = b["kv_bytes_after_each_reload"]
    step = kv[1] - kv[0]
    assert step > 0 and kv == [kv[0] + i * step for i in range(21)]  # exactly linear: one prefix set per reload
    assert b["r2"] == pytest.approx(1.0) and b["slope_bytes_per_reload"] == pytest.approx(step)
    assert b["models_alive_end"] == 21 and b["generations_with_kv_end"] == 21
    assert b["findings"]["KVG105"] == 20 and b["stale_bytes"] == 20 * step
    assert len(set(f["kv_bytes_after_each_reload"])) == 1 and f["models_alive_end"] == 1
    assert f["findings"] == {}
    assert b["requests"] == f["requests"] == 42
    assert twenty["ok"]


def test_render_names_the_ray_api_that_does_not_exist(twenty):
    text = rendered(hot_reload.render, twenty)
    assert "ray.get_runtime_context().get_kv(): that API does not exist in Ray" in text
    assert "held by: class kvguardian.apps.repro.reload_server.LruPrefixService: encode_prefix" in text
    from kvguardian.core.errors import UsageError

    with pytest.raises(UsageError, match=r"--reloads must be 2\.\.500"):
        hot_reload.run(argparse.Namespace(reloads=1, requests=2, json=False))
