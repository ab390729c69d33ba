"""Issue 13 against a real redis-server: hostile key names, credentials, thrown-away results, silent gaps,
internal errors and arguments that must be refused. Each test failed on the code before the fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from kvg_redis import RedisProc

from kvg_hostile import HostileServer
from kvg_testing import cli_command, wait_for_line, wait_for_scans

pytestmark = pytest.mark.services

HOSTILE_KEYS = ["[/oops]", "[bold red]markup[/]", "evil\x1b[2J", "title\x1b]0;pwned\x07",
                "line\nkv-guardian: all clear", "cr\rover", "rtl\u202egnp.exe", "iso\u2066x\u2069"]
CONTROL = [chr(c) for c in range(32) if c != 10] + ["\x7f", "\x9b", "\u202e", "\u2066", "\u2069"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory):
    """A server whose keys are named to break terminals and markup parsers (30 of each, no TTL)."""
    proc = RedisProc(tmp_path_factory.mktemp("hostile"))
    p = proc.client().pipeline(transaction=False)
    for name in HOSTILE_KEYS:
        for i in range(30):
            p.set(f"{name}:{i}", "v")
    p.execute()
    yield proc
    proc.stop()


def _raw_control(text: str) -> list[str]:
    return sorted({repr(c) for c in text if c in CONTROL})


def test_markup_and_control_characters_in_key_names_are_shown_escaped(hostile, kv_cli):
    """Items 6 and 7: '[/oops]:N' keys crashed the table (MarkupError, rc 70, findings lost), '[bold red]'
    rendered as markup, ESC/CR/LF reached the terminal raw and a newline forged lines."""
    rc, out, err = kv_cli("redis", "scan", hostile.url, "--cold-after", "0", "--top", "50", "--fail-on", "never")
    assert rc == 0, err
    assert "internal error" not in err
    assert not _raw_control(out + err)
    assert "[/oops]:{int}" in out and "[bold red]markup[/]:{int}" in out, "markup shown as text"
    assert "evil\\x1b[2J:{int}" in out and "line\\nkv-guardian: all clear" in out and "rtl\\u202egnp.exe" in out
    assert not any(line.startswith("kv-guardian: all clear") for line in out.splitlines())
    assert out.count("KVG301 cold-no-ttl-keys") == len(HOSTILE_KEYS), "every finding is printed"


def test_prometheus_output_escapes_label_values(hostile, kv_cli):
    """Item 7: CR and ESC passed into label values raw."""
    from prometheus_client.parser import text_string_to_metric_families

    rc, out, err = kv_cli("redis", "scan", hostile.url, "--prometheus", "-", "--top", "50", "--fail-on", "never")
    assert rc == 0, err
    assert not _raw_control(out)
    patterns = {s.labels["pattern"] for f in text_string_to_metric_families(out) for s in f.samples
                if "pattern" in s.labels}
    assert "line\\nkv-guardian: all clear:{int}" in patterns and "evil\\x1b[2J:{int}" in patterns
    assert all("\n" not in p and "\x1b" not in p for p in patterns)


def test_json_output_and_diff_carry_no_raw_control_characters(hostile, kv_cli, tmp_path):
    old = tmp_path / "old.json"
    rc, out, err = kv_cli("redis", "scan", hostile.url, "--json", "-o", str(old), "--fail-on", "never")
    assert rc == 0 and not _raw_control(out)
    assert {p["pattern"] for p in json.loads(out)["patterns"]} >= {f"{k}:{{int}}" for k in HOSTILE_KEYS}
    data = json.loads(old.read_text())
    data["started"] -= 3600
    old.write_text(json.dumps(data))
    for args in (("diff", str(old), str(old).replace("old", "new")), ("scan", hostile.url, "--compare", str(old))):
        if args[0] == "diff":
            rc, _, err = kv_cli("redis", "scan", hostile.url, "-o", args[2], "--json", "--fail-on", "never")
            assert rc == 0, err
        rc, out, err = kv_cli("redis", *args, "--fail-on", "never")
        assert rc == 0 and "internal error" not in err, err
        assert not _raw_control(out + err) and "[/oops]:{int}" in out


def test_passwords_in_the_query_and_in_redisclI_auth_are_masked_everywhere(tmp_path, kv_cli):
    """Item 8: ?password=… appeared in the JSON target and in error lines."""
    proc = RedisProc(tmp_path / "auth")
    proc.client().config_set("requirepass", "s3cret-Pw")
    try:
        url = f"redis://127.0.0.1:{proc.port}/0?password=s3cret-Pw"
        rc, out, err = kv_cli("redis", "scan", url, "--json", "--fail-on", "never")
        assert rc == 0, err
        assert "s3cret-Pw" not in out + err and json.loads(out)["target"].endswith("/0?password=***")
        rc, out, err = kv_cli("redis", "scan", url.replace("s3cret-Pw", "wrong-Pw1"))
        assert rc == 3 and "wrong-Pw1" not in err and "password=***" in err
        plain = f"redis://127.0.0.1:{proc.port}/0"
        rc, out, err = kv_cli("redis", "scan", plain, "--json", env={"REDISCLI_AUTH": "s3cret-Pw"})
        assert rc == 0 and "s3cret-Pw" not in out + err, err
        rc, out, err = kv_cli("redis", "scan", "redis://u:s3cret-Pw@127.0.0.1:1/x")
        assert rc == 2 and "s3cret-Pw" not in err and "database 'x'" in err
    finally:
        if proc.proc is not None:
            proc.proc.kill()
            proc.proc.wait(10)


def test_output_paths_are_checked_before_the_scan(hostile, kv_cli, tmp_path):
    """Item 9: -o /no/such/dir/x.json (or --prometheus BAD) was checked after the scan and lost it."""
    for flag in ("-o", "--prometheus"):
        rc, out, err = kv_cli("redis", "scan", hostile.url, flag, str(tmp_path / "no" / "such" / "x"))
        assert rc == 2 and out == "", err
        assert "checked before starting" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_ends_a_scan_like_ctrl_c_with_a_partial_result(tmp_path, sig, code):
    """Item 9: SIGTERM gave rc 143 and no partial result (Ctrl-C gave one)."""
    proc = RedisProc(tmp_path / "big")
    try:
        p = proc.client().pipeline(transaction=False)
        for i in range(20_000):
            p.set(f"k:{i}", "v")
        p.execute()
        cmd = cli_command("redis", "scan", proc.url, "--json", "--batch", "10", "--max-keys-per-sec", "1000",
                          "--fail-on", "never")
        scan = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_scans(proc.url)  # the scan is under way (it needs 20 s at 1,000 keys/s)
        t0 = time.monotonic()
        scan.send_signal(sig)
        out, err = scan.communicate(timeout=30)
        assert time.monotonic() - t0 < 10
    finally:
        proc.stop()
    assert scan.returncode == code, err
    data = json.loads(out)
    assert data["complete"] is False and data["incomplete_reason"] == "interrupted" and data["keys_scanned"] > 0
    assert f"interrupted ({signal.Signals(sig).name}); the result above is partial" in err


def test_an_acl_user_without_idletime_makes_the_scan_incomplete_with_a_warning(hostile, kv_cli):
    """Item 12: the scan said "complete" with idle -1 everywhere, so KVG301 could never fire."""
    r = hostile.client()
    r.execute_command("ACL", "SETUSER", "noidle", "on", ">pw-noidle", "~*", "+@read", "+info", "+ping", "+scan",
                      "+eval_ro", "+evalsha_ro", "+dbsize", "-object|idletime")
    url = f"redis://noidle:pw-noidle@127.0.0.1:{hostile.port}/0"
    rc, out, err = kv_cli("redis", "scan", url, "--json", "--fail-on", "never")
    assert rc == 0, err
    data = json.loads(out)
    assert data["complete"] is False and data["incomplete_reason"] == "idle times unknown"
    assert any("may not run OBJECT IDLETIME" in w and "+object|idletime" in w for w in data["warnings"])


def test_an_acl_user_without_dbsize_still_scans(hostile, kv_cli):
    """Item 13: missing +dbsize was an internal error (rc 70)."""
    hostile.client().execute_command("ACL", "SETUSER", "nodbsize", "on", ">pw-nodb", "~*", "+@read", "+info",
                                     "+ping", "+scan", "+eval_ro", "+evalsha_ro", "+object|idletime", "-dbsize")
    rc, out, err = kv_cli("redis", "scan", f"redis://nodbsize:pw-nodb@127.0.0.1:{hostile.port}/0", "--json",
                          "--fail-on", "never")
    assert rc == 0, err
    data = json.loads(out)
    assert data["keys_scanned"] == 30 * len(HOSTILE_KEYS) and any("DBSIZE" in w for w in data["warnings"])


@pytest.mark.parametrize(("grants", "refused"), [(["+ping"], "select"), (["+select"], "ping")])
def test_an_acl_user_refused_at_connect_is_told_the_command_redis_named(hostile, kv_cli, grants, refused):
    """A user without +select (a URL with /1 sends SELECT before PING) was told "may not run PING ...; grant
    +ping" while Redis had named SELECT: the fix named the wrong command."""
    user = f"only{grants[0][1:]}"
    hostile.client().execute_command("ACL", "SETUSER", user, "on", ">pw-c", "~*", *grants, "+hello", "+auth")
    rc, _out, err = kv_cli("redis", "scan", f"redis://{user}:pw-c@127.0.0.1:{hostile.port}/1")
    assert rc == 3 and len(err.strip().splitlines()) == 1, err
    assert f"may not run {refused.upper()} " in err and f"grant +{refused} " in err and "pw-c" not in err


@pytest.mark.parametrize(("tail", "rc", "says"), [
    ("PORT/99", 3, "DB index is out of range; fix: pick a database the server has"),
    ("0/0", 2, "names port 0; fix: the server's port"),  # redis-py took port 0 for 6379: another server
    ("PORT/0?ssl_cert_reqs=none", 2, "the TLS option 'ssl_cert_reqs', which only a rediss:// URL takes"),
])
def test_urls_that_name_the_wrong_thing_are_one_line_with_the_fix(hostile, kv_cli, tail, rc, says):
    url = "redis://127.0.0.1:" + tail.replace("PORT", str(hostile.port))
    code, _out, err = kv_cli("redis", "scan", url)
    assert code == rc and says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("mode, body", [("redis-reply", b"E\r\n"), ("http", b""), ("garbage", b""),
                                        ("long-header", b"")])
def test_a_server_that_is_not_redis_is_one_line(kv_cli, mode, body):
    """Item 13: a non-Redis server ('Protocol error, got "E"') was an internal error (rc 70)."""
    with HostileServer(mode, body=body or b"x") as server:
        rc, _out, err = kv_cli("redis", "scan", server.redis_url, "--timeout", "3")
    assert rc == 3, err
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err and not _raw_control(err)


@pytest.mark.parametrize("argv, fragment", [
    (["--timeout", "nan"], "--timeout nan"), (["--timeout", "inf"], "--timeout inf"),
    (["--cold-after", "1e400"], "--cold-after '1e400' is out of range"), (["--cold-after", "nan"], "out of range"),
    (["--top", "-5"], "--top -5 must be >= 1"), (["--min-keys", "-1"], "--min-keys -1 must be >= 0"),
    (["--max-keys-per-sec", "nan"], "--max-keys-per-sec nan"),
    (["--max-keys-per-sec", "1e-300"], "--max-keys-per-sec 1e-300 is out of range"),  # was rc 70 (sleep overflow)
])
def test_bad_scan_arguments_are_refused(hostile, kv_cli, argv, fragment):
    rc, _out, err = kv_cli("redis", "scan", hostile.url, *argv)
    assert rc == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, fragment", [
    (["--interval", "0"], "--interval 0 must be > 0"), (["--interval", "-5"], "out of range"),
    (["--interval", "nan"], "out of range"), (["--top", "-5"], "--top -5"), (["--min-keys", "-1"], "--min-keys -1"),
    (["--port", "70000"], "--port 70000 is not a TCP port"),
    (["--host", "203.0.113.7"], "fix: bind an address of this machine (127.0.0.1, 0.0.0.0, or an interface's "
                                "address) with --host"),
    (["--addr", "203.0.113.7"], "with --host"),  # --addr: the 0.1.0 name of --host, hidden for one release
])
def test_bad_exporter_arguments_are_refused(hostile, kv_cli, argv, fragment):
    """Items 13, 14 and 17: --interval 0 scanned back to back, --port 70000 was rc 70, a bad --addr (now --host)
    said 'pick another --port'."""
    rc, _out, err = kv_cli("redis", "exporter", hostile.url, *argv, timeout=30)
    assert rc in (2, 3) and fragment in err and len(err.strip().splitlines()) == 1, err


def test_a_named_database_that_is_not_a_number_is_refused(hostile, kv_cli):
    """Item 14: redis://…/abc silently read db 0."""
    rc, _out, err = kv_cli("redis", "scan", hostile.url.replace("/0", "/abc"))
    assert rc == 2 and "names database 'abc'" in err


def test_stdout_on_a_full_disk_is_one_line(hostile):
    """Item 13: writing to a full disk was an internal error."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(cli_command("redis", "scan", hostile.url, "--json"), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().endswith("fix: free space or write elsewhere (-o FILE)")
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_output_file_that_cannot_be_written_loses_nothing_else(hostile, kv_cli, tmp_path):
    """-o on a full disk raised after the scan: the table, the HTML page and the --prometheus file after it
    were never written, and the line did not say which flag (rc 2)."""
    prom, page = tmp_path / "s.prom", tmp_path / "s.html"
    rc, out, err = kv_cli("redis", "scan", hostile.url, "-o", "/dev/full", "--prometheus", str(prom), "--html",
                          str(page), "--fail-on", "never")
    assert rc == 3, err
    assert "cannot write -o '/dev/full': No space left on device; the result was still shown" in err
    assert "key patterns by memory" in out and prom.read_text().startswith("# HELP") and page.stat().st_size
    assert len(err.strip().splitlines()) == 1


def _scan_file(tmp_path: Path, hostile, kv_cli) -> dict:
    path = tmp_path / "scan.json"
    rc, _, err = kv_cli("redis", "scan", hostile.url, "-o", str(path), "--fail-on", "never")
    assert rc == 0, err
    return json.loads(path.read_text())


@pytest.mark.parametrize("damage, fragment", [
    (lambda d: d["patterns"][0].update(bytes="lots"), "must be an integer >= 0, got 'lots'"),
    (lambda d: d["patterns"][0].pop("bytes"), "KeyError"),
    (lambda d: d.update(started="NaN"), "'started' must be a finite number"),
    (lambda d: d["patterns"][0].update(ttl=[1]), "expected an object"),
])
def test_damaged_diff_inputs_are_one_line(hostile, kv_cli, tmp_path, damage, fragment):
    """Items 13 and 14: "bytes": "lots", a missing "bytes", "started": "NaN" (then bare NaN in --json)."""
    data = _scan_file(tmp_path, hostile, kv_cli)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(data))
    damage(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    rc, _out, err = kv_cli("redis", "diff", str(good), str(bad), "--json")
    assert rc == 2 and "damaged kv-guardian Redis scan" in err and fragment in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_non_utf8_or_nan_json_diff_input_is_one_line(kv_cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"schema": "kv-guardian/redis-scan", "target": "\xff\xfe"}')
    rc, _, err = kv_cli("redis", "diff", str(bad), str(bad))
    assert rc == 2 and "is not UTF-8 text" in err, err
    bad.write_text('{"schema": "kv-guardian/redis-scan", "version": 1, "started": NaN}')
    rc, _out, err = kv_cli("redis", "diff", str(bad), str(bad))
    assert rc == 2 and "NaN is not a JSON value" in err, err


def test_the_exporter_ends_within_seconds_on_sigterm_even_mid_scan(hostile):
    cmd = cli_command("redis", "exporter", hostile.url, "--port", "0", "--interval", "1s")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc.stderr, "serving http://127.0.0.1:")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0 and time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
    assert os.path.exists(str(hostile.dir))
