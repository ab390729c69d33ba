"""Keys expiring mid-scan, binary and very long names, a server restarted mid-scan, Ctrl-C, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from kvg_redis import free_port, seed

from kvguardian.keyspace.probe import LUA_PROBE, LUA_SCAN_SHA, Lane, choose_mode
from kvguardian.keyspace.scan import ScanOptions, scan
from kvguardian.keyspace.stats import PatternStats

pytestmark = pytest.mark.services


def test_keys_that_vanish_between_scan_and_probe_are_counted_not_crashed(redis_proc):
    r = redis_proc.client()
    r.set("gone:1", "x")
    lane = Lane(r, "test", mode="lua", sub="IDLETIME", batch=10, match=None)
    r.execute_command("EVAL_RO", LUA_PROBE, 0, "IDLETIME")  # load the script, as choose_mode does
    lane.send([b"gone:1", b"never:existed"], scan=False)
    keys, probe, _ = lane.receive()
    lane.close()
    assert probe is not None and probe[0, 0] == 0 and probe[1].tolist() == [-1, -1, -2, -1]
    stats = PatternStats(cold_after=10)
    stats.ensure(2)
    stats.add_batch(np.array([1, 1]), keys, probe)
    assert stats.keys_vanished == 1 and int(stats.keys[1]) == 1


def test_scan_probe_after_script_flush_reloads_and_loses_no_step(redis_proc):
    r = redis_proc.client()
    for i in range(300):
        r.set(f"k:{i}", "v")
    assert choose_mode(r, (7, 0), "IDLETIME")[0] == "lua"
    lane = Lane(r, "test", mode="lua", sub="IDLETIME", batch=50, match=None)
    seen: list[bytes] = []
    lane.send([], scan=True)
    for step in range(1000):
        if step == 2:
            r.script_flush()  # the next call answers NOSCRIPT: that step is scanned on its own, then probed
        keys, probe, _ = lane.receive()
        assert probe is not None and len(probe) == len(keys) and (probe[:, 0] == 0).all()
        seen += keys
        if lane.cursor == 0:
            break
        lane.send([], scan=True)
    lane.close()
    assert sorted(seen) == sorted(f"k:{i}".encode() for i in range(300))
    assert r.script_exists(LUA_SCAN_SHA) == [True]


def test_keys_expiring_during_the_scan(redis_proc):
    r = redis_proc.client()
    p = r.pipeline(transaction=False)
    for i in range(3000):
        p.set(f"shortlived:{i}", "v", px=100 + (i % 50) * 20)  # expire over the first second
    for i in range(500):
        p.set(f"stays:{i}", "v")
    p.execute()
    result = scan(redis_proc.url, ScanOptions(batch=50, max_keys_per_sec=3000))
    assert result.complete
    counted = sum(p["keys"] for p in result.patterns)
    assert counted + result.keys_vanished == result.keys_scanned
    assert {p["pattern"]: p["keys"] for p in result.patterns}["stays:{int}"] == 500


def test_binary_and_very_long_key_names(redis_proc, kv_cli):
    r = redis_proc.client()
    seed(r)
    for i in range(40):
        r.set(b"bin:\xff\x00\xfe" + bytes([i]) * 3, "v")
    r.set("long:" + "x" * 100_000, "v")
    r.set("naïve:ключ:" + "é" * 10, "v")
    rc, out, err = kv_cli("redis", "scan", redis_proc.url, "--json", "--fail-on", "never")
    assert rc == 0, err
    data = json.loads(out)
    assert data["complete"] and data["keys_scanned"] == r.dbsize()
    longest = max(len(t["key"]) for p in data["patterns"] for t in p["top_keys"])
    assert longest < 300  # shown cut, with the length
    assert any("chars)" in t["key"] for p in data["patterns"] for t in p["top_keys"])
    assert any(p["pattern"].startswith("bin:") for p in data["patterns"])
    assert any("\\x" in (p["example_key"] or "") for p in data["patterns"])
    assert len(data["patterns"]) < 20


def _scan_process(url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "kvguardian", "redis", "scan", url, "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_until_scanning(r, calls: int = 4) -> None:
    """Until the scan subprocess has probed a few batches (its start-up time varies with the machine).

    4 calls: the mode check's own EVALSHA_RO, then batches 1-3. The scan sends batch n+1 before it counts
    batch n, so only once batch 3 has run on the server is batch 1 surely counted by the client."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if r.info("commandstats").get("cmdstat_evalsha_ro", {}).get("calls", 0) >= calls:
            return
        time.sleep(0.05)
    raise AssertionError("the scan did not start within 60 s")


def test_server_restarted_mid_scan_gives_a_partial_result_not_a_hang(redis_proc):
    r = redis_proc.client()
    seed(r, scale=3)
    proc = _scan_process(redis_proc.url, "--max-keys-per-sec", "600", "--batch", "50", "--timeout", "5")
    _wait_until_scanning(r)
    redis_proc.restart()  # kill -9 and start again on the same port
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    data = json.loads(out)
    assert data["complete"] is False and data["incomplete_reason"].startswith("connection lost after")
    assert 0 < data["keys_scanned"] < data["dbsize"]
    assert err.strip().count("\n") == 0 and "partial" in err and "Traceback" not in err


def test_ctrl_c_gives_a_partial_result_marked_incomplete(redis_proc):
    seed(redis_proc.client(), scale=3)
    proc = _scan_process(redis_proc.url, "--max-keys-per-sec", "600", "--batch", "50")
    _wait_until_scanning(redis_proc.client())
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    data = json.loads(out)
    assert data["complete"] is False and data["incomplete_reason"] == "interrupted" and data["keys_scanned"] > 0
    assert "Traceback" not in err


@pytest.mark.parametrize(("url", "code", "text"), [
    ("http://127.0.0.1:6379", 2, "scheme must be one of redis://, rediss://, unix://"),
    ("redis://127.0.0.1:{dead}/0", 3, "cannot reach Redis at redis://127.0.0.1:"),
    ("redis://u:secret@127.0.0.1:{dead}/0", 3, "redis://u:***@127.0.0.1"),
    ("unix://", 2, "names no socket path"),
])
def test_bad_urls_are_one_line(kv_cli, url, code, text):
    rc, out, err = kv_cli("redis", "scan", url.format(dead=free_port()), "--timeout", "2")
    assert rc == code and text in err and err.count("\n") == 1 and "secret" not in err and not out


def test_bad_options_are_one_line(kv_cli, redis_proc):
    for args, text in ((("--batch", "-1"), "--batch -1 is out of range"),  # 0 is valid: the adaptive batch
                       (("--max-call-ms", "0"), "--max-call-ms 0 is out of range"),
                       (("--cold-after", "soon"), "bad duration"),
                       (("--compare", "/nonexistent.json"), "cannot read scan file")):
        rc, _, err = kv_cli("redis", "scan", redis_proc.url, *args)
        assert rc == 2 and text in err and err.count("\n") == 1, err


def test_unix_socket_url(tmp_path):
    from kvg_redis import RedisProc

    sock = tmp_path / "r.sock"
    proc = RedisProc(tmp_path / "unix", "--unixsocket", str(sock), "--unixsocketperm", "700")
    try:
        seed(proc.client())
        result = scan(f"unix://{sock}", ScanOptions())
        assert result.complete and result.keys_scanned == proc.client().dbsize()
        assert result.server["nodes"][0]["addr"] == str(sock)
    finally:
        proc.stop()
