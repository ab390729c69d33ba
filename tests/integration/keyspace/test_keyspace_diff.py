"""Growth between two scans: `redis diff OLD NEW` and `redis scan --compare OLD` (KVG303, KVG304)."""

from __future__ import annotations

import json

import pytest
from kvg_redis import seed

pytestmark = pytest.mark.services


def _grow(r):
    p = r.pipeline(transaction=False)
    for i in range(150, 450):
        p.set(f"tmp_{1_712_345_678_000_000_000 + i * 7919}", "t" * 20)  # tmp_{ts_ns}: 150 → 450 keys
    for i in range(60):
        p.rpush(f"feed:{i}", *[f"item-{j}-{'x' * 40}" for j in range(200)])  # every feed list grows
    p.execute()


def test_diff_reports_growth_rates_and_growing_collections(redis_proc, kv_cli, tmp_path):
    r = redis_proc.client()
    seed(r)
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    rc, _, err = kv_cli("redis", "scan", redis_proc.url, "-o", str(old), "--fail-on", "never", "--json")
    assert rc == 0, err
    _grow(r)
    rc, _, err = kv_cli("redis", "scan", redis_proc.url, "-o", str(new), "--fail-on", "never", "--json")
    assert rc == 0, err
    rc, out, err = kv_cli("redis", "diff", str(old), str(new), "--json")
    assert rc == 0, err  # growth findings are warnings; the default --fail-on is error
    data = json.loads(out)
    rows = {row["pattern"]: row for row in data["rows"]}
    tmp = rows["tmp_{ts_ns}"]
    assert (tmp["keys_old"], tmp["keys_new"], tmp["keys_delta"]) == (150, 450, 300)
    assert tmp["keys_per_hour"] > 0 and tmp["bytes_delta"] > 0
    assert rows["session:{uuid}"]["keys_delta"] == 0
    ids = {(f["id"], f["evidence"]["pattern"]) for f in data["findings"]}
    assert ("KVG303", "tmp_{ts_ns}") in ids
    assert ("KVG304", "feed:{int}") in ids
    assert not any(p == "session:{uuid}" for _, p in ids)
    f304 = next(f for f in data["findings"] if f["id"] == "KVG304")
    assert f304["evidence"]["bytes_per_key_new"] > 2 * f304["evidence"]["bytes_per_key_old"]
    assert f304["evidence"]["example_key"].startswith("feed:") and "LTRIM" in f304["fix"]
    rc, _, _ = kv_cli("redis", "diff", str(old), str(new), "--fail-on", "warning")
    assert rc == 1
    rc, out, err = kv_cli("redis", "scan", redis_proc.url, "--compare", str(old), "--json", "--fail-on", "never")
    assert rc == 0, err
    assert {"KVG303", "KVG304"} <= {f["id"] for f in json.loads(out)["findings"]}
    rc, out, _ = kv_cli("redis", "diff", str(old), str(new))
    assert rc == 0 and "tmp_{ts_ns}" in out and "KVG303" in out


def test_diff_refuses_bad_files_in_one_line(kv_cli, tmp_path, redis_proc):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    good = tmp_path / "good.json"
    assert kv_cli("redis", "scan", redis_proc.url, "-o", str(good), "--json")[0] == 0
    for args, text in (((str(bad), str(good)), "is not JSON (line 1"),
                       ((str(other), str(good)), "is not a kv-guardian Redis scan"),
                       ((str(good), str(tmp_path / "missing.json")), "cannot read scan file"),
                       ((str(good), str(good)), "is not later than OLD")):
        rc, _, err = kv_cli("redis", "diff", *args)
        assert rc == 2 and text in err and err.count("\n") == 1, err
    redacted = tmp_path / "red.json"
    assert kv_cli("redis", "scan", redis_proc.url, "-o", str(redacted), "--json", "--redact")[0] == 0
    rc, _, err = kv_cli("redis", "diff", str(good), str(redacted))
    assert rc == 2 and "one scan is redacted" in err
