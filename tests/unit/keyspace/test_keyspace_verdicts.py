import copy
import json

import pytest

from kvguardian.core.errors import UsageError
from kvguardian.keyspace.redact import Redactor, redact_result
from kvguardian.keyspace.result import ScanResult
from kvguardian.keyspace.verdicts import diff, scan_findings


def _pattern(name, placeholders, keys, no_ttl, cold, coll=0, coll_bytes=0, top=None):
    return {"pattern": name, "placeholders": placeholders, "overflow": False, "keys": keys, "bytes": keys * 100,
            "bytes_p50": 100, "bytes_max": 120, "no_ttl_keys": no_ttl, "no_ttl_bytes": no_ttl * 100,
            "cold_keys": cold, "cold_bytes": cold * 100, "collection_keys": coll, "collection_bytes": coll_bytes,
            "ttl": {"none": no_ttl}, "idle_s": {"p50": 900, "p90": 1000, "max": 2000}, "types": {"string": keys},
            "top_keys": top or [], "example_key": name.replace("{", "").replace("}", "") + "-ex",
            "example_cold_key": None}


def _result(patterns, started=1000.0, roles=("master",)):
    return ScanResult(target="redis://h:1/0", started=started, finished=started + 1, cold_after=600,
                      server={"nodes": [{"role": r} for r in roles]}, patterns=patterns)


def test_scan_verdicts():
    r = _result([_pattern("user:{int}:profile", ["int"], 500, 500, 400),
                 _pattern("tmp_{ts_ns}", ["ts_ns"], 300, 300, 0),
                 _pattern("session:{uuid}", ["uuid"], 900, 0, 0),
                 _pattern("config:{str}", ["str"], 30, 30, 0),
                 _pattern("few:{uuid}", ["uuid"], 5, 5, 5)])
    got = sorted((f.id, f.evidence["pattern"]) for f in scan_findings(r))
    assert got == [("KVG301", "user:{int}:profile"), ("KVG302", "tmp_{ts_ns}"), ("KVG305", "config:{str}")]
    f = scan_findings(r)[0]
    assert "400 of 500 keys" in f.message and f.evidence["cold_bytes"] == 40_000 and "TTL" in f.fix


def test_cold_verdict_is_off_on_a_replica():
    r = _result([_pattern("user:{int}:profile", ["int"], 500, 500, 400)], roles=("slave",))
    assert [f.id for f in scan_findings(r)] == ["KVG305"]


def test_diff_growth_and_collections():
    old = _result([_pattern("q:{int}", ["int"], 100, 100, 0, coll=100, coll_bytes=100 * 1000,
                            top=[{"key": "q:1", "bytes": 5000}]),
                   _pattern("s:{uuid}", ["uuid"], 1000, 0, 0)])
    new = _result([_pattern("q:{int}", ["int"], 100, 100, 0, coll=100, coll_bytes=100 * 3000,
                            top=[{"key": "q:1", "bytes": 9000}]),
                   _pattern("s:{uuid}", ["uuid"], 1000, 0, 0),
                   _pattern("t_{ts_ms}", ["ts_ms"], 500, 500, 0)], started=1000 + 7200)
    rows, findings, warnings = diff(old, new)
    assert not warnings
    got = sorted((f.id, f.evidence["pattern"]) for f in findings)
    assert got == [("KVG303", "t_{ts_ms}"), ("KVG304", "q:{int}")]
    t = next(r for r in rows if r["pattern"] == "t_{ts_ms}")
    assert t["new_pattern"] and t["keys_per_hour"] == 250.0
    f304 = next(f for f in findings if f.id == "KVG304")
    assert f304.evidence["grown_top_keys"] == [{"key": "q:1", "bytes_old": 5000, "bytes_new": 9000}]
    with pytest.raises(UsageError, match="not later than OLD"):
        diff(new, old)


def test_redaction_is_stable_and_hides_literals():
    r = _result([_pattern("user:{int}:profile", ["int"], 500, 500, 400,
                          top=[{"key": "user:42:profile", "bytes": 9}])])
    a, b = redact_result(r), redact_result(copy.deepcopy(r))
    assert a.patterns == b.patterns and a.redacted
    text = json.dumps(a.to_dict())
    assert "user" not in text and "profile" not in text and "42" not in text
    pat = a.patterns[0]["pattern"]
    assert pat.count("{int}") == 1 and pat.startswith("~")
    assert a.patterns[0]["top_keys"][0]["key"].split(":")[0] == pat.split(":")[0]
    assert Redactor(salt="x").token("user") != Redactor(salt="y").token("user")


def test_result_round_trip_and_bad_input():
    r = _result([_pattern("a:{int}", ["int"], 20, 20, 20)])
    r.findings = scan_findings(r)
    again = ScanResult.from_dict(json.loads(r.to_json()))
    assert again.to_dict() == r.to_dict()
    with pytest.raises(UsageError, match="is not a kv-guardian Redis scan"):
        ScanResult.from_dict({"x": 1})
    bad = r.to_dict()
    bad["version"] = 99
    with pytest.raises(UsageError, match="schema version 99"):
        ScanResult.from_dict(bad)
    bad = r.to_dict()
    del bad["patterns"][0]["pattern"]
    with pytest.raises(UsageError, match="damaged"):
        ScanResult.from_dict(bad)


def test_a_no_ttl_finding_shows_a_key_without_a_ttl():
    """The pattern's first key may have a TTL; the KVG302/305 example is one of the keys that have none."""
    p = _pattern("{str}:{uuid}", ["uuid"], 5000, 200, 0)
    p["example_key"], p["example_no_ttl_key"] = "invoice:1", "websess:2"
    (f,) = scan_findings(_result([p]))
    assert f.id == "KVG302" and f.evidence["example_key"] == "websess:2"


def test_a_time_window_in_the_name_is_a_key_name_explosion_not_just_no_ttl():
    """rate:{ip}:{epoch-minute} without a TTL: every minute leaves its keys behind (KVG302, not KVG305)."""
    now = 1_796_000_000.0  # 2026-11-30
    minute = int(now // 60)

    def rate(values, name="rate:{ip}:{int}", prefix="rate:10.0.0.{i}:"):
        top = [{"key": prefix.format(i=i) + str(v), "bytes": 60} for i, v in enumerate(values)]
        row = _pattern(name, ["int", "ip"], 400, 400, 0, top=top)
        row["example_key"] = top[0]["key"]
        return row

    r = _result([rate([minute - 3, minute - 2, minute - 1, minute]),
                 rate([17, 93_412, 5_000_000], name="user:{ip}:{int}", prefix="user:10.0.0.{i}:"),  # ids
                 rate([minute - 5, minute - 4], name="old:{ip}:{int}", prefix="old:10.0.0.{i}:")], started=now)
    got = {f.evidence["pattern"]: f for f in scan_findings(r)}
    assert got["rate:{ip}:{int}"].id == "KVG302" and got["rate:{ip}:{int}"].evidence["time_window"] == "minute"
    assert "time window" in got["rate:{ip}:{int}"].message and "TTL" in got["rate:{ip}:{int}"].fix
    assert got["user:{ip}:{int}"].id == "KVG305"
    assert got["old:{ip}:{int}"].id == "KVG302"  # two values suffice for minutes
    hour = int(now // 3600)
    assert scan_findings(_result([rate([hour - 1, hour])], started=now))[0].evidence["time_window"] == "hour"
    two_years_on = scan_findings(_result([rate([minute - 1, minute])], started=now + 2 * 365 * 86400))
    assert [f.id for f in two_years_on] == ["KVG305"]  # not near the scan: an id that happens to look like one
    day = int(now // 86400)  # (after an IP, 5 digits read as its port: the day case has no IP)
    days = {"name": "quota:{int}", "prefix": "quota:"}
    assert [f.id for f in scan_findings(_result([rate([day - 1, day], **days)], started=now))] == ["KVG305"]
    three = scan_findings(_result([rate([day - 2, day - 1, day], **days)], started=now))
    assert three[0].evidence["time_window"] == "day"


def test_few_windows_kept_as_literals_are_recognised_through_their_siblings():
    """While there are few windows the miner keeps each as a literal: rate:{ip}:29933333, rate:{ip}:29933332 (the
    way a real Redis scan mined them). Siblings that differ only there are one time-windowed name."""
    now = 1_796_000_000.0
    minute = int(now // 60)
    rows = [_pattern(f"rate:{{ip}}:{minute - w}", ["ip"], 30, 30, 0) for w in range(3)]
    rows.append(_pattern(f"alone:{{ip}}:{minute}", ["ip"], 30, 30, 0))  # one value: could be anything
    old = minute - 2 * 365 * 1440  # minutes two years before the scan: ids, as far as anyone can tell
    rows.append(_pattern(f"build:{{ip}}:{old}", ["ip"], 30, 30, 0))
    rows.append(_pattern(f"build:{{ip}}:{old + 1}", ["ip"], 30, 30, 0))
    got = {f.evidence["pattern"]: f.id for f in scan_findings(_result(rows, started=now))}
    assert [got[f"rate:{{ip}}:{minute - w}"] for w in range(3)] == ["KVG302"] * 3
    assert got[f"alone:{{ip}}:{minute}"] == "KVG305"
    assert got[f"build:{{ip}}:{old}"] == got[f"build:{{ip}}:{old + 1}"] == "KVG305"
