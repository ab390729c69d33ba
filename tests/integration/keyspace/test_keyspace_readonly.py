"""The scan writes nothing, resets no idle time, and works for a read-only ACL user."""

from __future__ import annotations

import time

import pytest
from kvg_redis import seed

from kvguardian.core.errors import UsageError
from kvguardian.keyspace.scan import ScanOptions, scan

pytestmark = pytest.mark.services

# what a scan may send: reads without side effects, plus the facts it needs
ALLOWED = {"scan", "type", "memory|usage", "pttl", "object|idletime", "object|freq", "evalsha_ro", "eval_ro",
           "info", "dbsize", "ping", "cluster|nodes", "client|setinfo", "hello", "select",
           "time"}  # the probe script times itself (a user without +time gets round-trip pacing)
RO_COMMANDS = ("+scan +type +pttl +memory|usage +object|idletime +object|freq +info +dbsize +ping +evalsha_ro "
               "+eval_ro +select +cluster|nodes")


def _writes_and_idle_state(r):
    idle = {k: r.object("idletime", k) for k in r.scan_iter(count=500)}
    persistence = r.info("persistence")["rdb_changes_since_last_save"]
    keyspace = {db: (v["keys"], v["expires"]) for db, v in r.info("keyspace").items()}  # avg_ttl moves with time
    return keyspace, persistence, idle


@pytest.mark.parametrize("mode", ["lua", "pipeline"])
def test_scan_writes_nothing_and_resets_no_idle_time(redis_proc, mode):
    r = redis_proc.client()
    seed(r)
    r.save()  # rdb_changes_since_last_save → 0: any write from now on shows
    time.sleep(2.1)
    keyspace0, changes0, idle0 = _writes_and_idle_state(r)
    assert changes0 == 0 and min(idle0.values()) >= 2
    r.config_resetstat()
    result = scan(redis_proc.url, ScanOptions(mode=mode, batch=120))
    assert result.complete and result.keys_scanned == len(idle0) and result.mode == mode
    stats = r.info("commandstats")
    keyspace1, changes1, idle1 = _writes_and_idle_state(r)
    sent = {name.removeprefix("cmdstat_") for name in stats}
    assert sent - ALLOWED - {"config|resetstat", "object|idletime"} == set(), sent
    assert "keys" not in sent and not any(c in sent for c in ("get", "strlen", "hlen", "llen", "set", "del"))
    assert changes1 == 0, "the scan made the dataset dirty (a write)"
    assert keyspace1 == keyspace0
    # idle times only grew: the probe touched no key (OBJECT IDLETIME is whole seconds)
    assert all(idle1[k] >= idle0[k] for k in idle0)
    assert result.patterns and min(p["idle_s"]["p50"] for p in result.patterns) >= 2


def _acl_user(r, name, rules):
    r.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw-" + name, "resetchannels", "%R~*", *rules.split())


def test_read_only_acl_user_can_scan_and_can_do_nothing_else(redis_proc):
    import redis

    admin = redis_proc.client()
    seed(admin)
    _acl_user(admin, "kvg", RO_COMMANDS)
    url = f"redis://kvg:pw-kvg@127.0.0.1:{redis_proc.port}/0"
    result = scan(url, ScanOptions(cold_after=3600))
    assert result.complete and result.mode == "lua" and result.keys_scanned == admin.dbsize()
    assert "pw-kvg" not in result.target and "***" in result.target
    ro = redis.Redis(host="127.0.0.1", port=redis_proc.port, username="kvg", password="pw-kvg")
    for cmd in (("SET", "x", "1"), ("KEYS", "*"), ("CONFIG", "GET", "maxmemory"), ("GET", "config:flagaa"),
                ("DEL", "tmp_1"), ("FLUSHALL",)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            ro.execute_command(*cmd)


def test_without_script_permission_the_pipeline_is_used(redis_proc):
    admin = redis_proc.client()
    seed(admin)
    _acl_user(admin, "noscript", RO_COMMANDS.replace("+evalsha_ro +eval_ro ", ""))
    result = scan(f"redis://noscript:pw-noscript@127.0.0.1:{redis_proc.port}", ScanOptions())
    assert result.complete and result.mode == "pipeline" and "scripting is not allowed" in result.mode_reason
    assert result.keys_scanned == admin.dbsize()
    with pytest.raises(UsageError, match="--mode lua: scripting is not allowed"):
        scan(f"redis://noscript:pw-noscript@127.0.0.1:{redis_proc.port}", ScanOptions(mode="lua"))


def test_missing_probe_permission_is_one_clear_line(redis_proc, kv_cli):
    admin = redis_proc.client()
    seed(admin)
    _acl_user(admin, "nomem", RO_COMMANDS.replace("+memory|usage ", ""))
    rc, out, err = kv_cli("redis", "scan", f"redis://nomem:pw-nomem@127.0.0.1:{redis_proc.port}", "--json")
    assert not out  # nothing half-written on stdout
    assert rc == 3, err
    assert err.count("\n") == 1 and "memory|usage" in err and "pw-nomem" not in err and "Traceback" not in err
    rc, _, err = kv_cli("redis", "scan", f"redis://nomem:wrong@127.0.0.1:{redis_proc.port}")
    assert rc == 3 and "refused the credentials" in err and "wrong" not in err


def test_lfu_policy_reads_object_freq(redis_proc):
    r = redis_proc.client()
    r.config_set("maxmemory-policy", "allkeys-lfu")
    seed(r)
    result = scan(redis_proc.url, ScanOptions(cold_freq=0))
    assert result.complete and result.idle_metric == "freq" and result.mode == "lua"
    p = {p["pattern"]: p for p in result.patterns}["tmp_{ts_ns}"]
    assert p["lfu_freq"]["max"] >= 1  # new keys start at LFU_INIT_VAL (5) and have not decayed yet
    assert p["cold_keys"] == 0
