"""An output path that is also an input (or another output) is refused before any work, a lost output is not
a clean exit, and input files that are not regular files or are absurd give one line, never a hang."""

from __future__ import annotations

import json
import os
import sys

import pytest

from kvguardian.apps.mini_server.tenancy import KeyRing
from kvguardian.core.errors import UsageError

REPORT = {"tool": "kv-guardian", "findings": [{"id": "KVG102", "severity": "warning", "message": "kept"}]}


def _one_line(err: str) -> bool:
    return err.count("\n") == 1 and "Traceback" not in err


def test_run_refuses_a_report_path_that_is_the_program(tmp_path, kv_cli):
    app = tmp_path / "app.py"
    app.write_text("print('hello')\n")
    rc, out, err = kv_cli("run", "--output", str(app), "--", sys.executable, str(app))
    assert rc == 2 and "is also a file the program is given" in err and _one_line(err)
    assert app.read_text() == "print('hello')\n" and not out


def test_report_refuses_to_write_over_its_input_or_one_output_twice(tmp_path, kv_cli):
    src = tmp_path / "r.json"
    src.write_text(json.dumps(REPORT))
    before = src.read_text()
    rc, _, err = kv_cli("report", str(src), "-o", str(src))
    assert rc == 2 and "is also the report read" in err and _one_line(err) and src.read_text() == before
    same = tmp_path / "x.out"
    rc, _, err = kv_cli("report", str(src), "-o", str(same), "--trace", str(tmp_path / "." / "x.out"))
    assert rc == 2 and "is also the -o file" in err and not same.exists()


def test_redis_rdb_refuses_to_write_over_the_snapshot(tmp_path, kv_cli):
    rdb = tmp_path / "dump.rdb"
    rdb.write_bytes(b"REDIS0011\xff" + bytes(8))
    rc, _, err = kv_cli("redis", "rdb", str(rdb), "--output", str(rdb))
    assert rc == 2 and "is also the RDB file read" in err and rdb.read_bytes() == b"REDIS0011\xff" + bytes(8)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_run_whose_report_cannot_be_written_does_not_exit_0(tmp_path, kv_cli):
    rc, _, err = kv_cli("run", "--output", "/dev/full", "--", sys.executable, "-c", "pass")
    assert rc == 3 and "cannot write --output" in err
    # --report: the 0.1.0 name of --output, still accepted (hidden) for one release
    rc, _, err = kv_cli("run", "--report", "/dev/full", "--", sys.executable, "-c", "raise SystemExit(5)")
    assert rc == 5  # the program's own failure keeps its code


def test_inputs_that_are_not_regular_files_give_one_line(tmp_path, kv_cli):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        rc, _, err = kv_cli("report", path, "-o", str(tmp_path / "o.html"), timeout=60)
        assert rc == 2 and _one_line(err) and ("not a regular file" in err or "is a folder" in err), (path, err)
    rc, _, err = kv_cli("redis", "diff", str(fifo), str(fifo), timeout=60)
    assert rc == 2 and "not a regular file" in err and _one_line(err)


def test_a_huge_value_in_an_error_is_cut(tmp_path, kv_cli):
    bad = tmp_path / "sev.json"
    bad.write_text(json.dumps({"tool": "kv-guardian", "findings": [
        {"id": "KVG102", "severity": "x" * 1_000_000, "message": "m"}]}))
    rc, _, err = kv_cli("report", str(bad), "-o", str(tmp_path / "o.html"))
    assert rc == 2 and _one_line(err) and len(err) < 2_500


def test_an_empty_keys_file_does_not_leave_the_server_open(tmp_path):
    empty = tmp_path / "keys.txt"
    empty.write_text("# no keys yet\n\n")
    with pytest.raises(UsageError, match="holds no API key"):
        KeyRing.from_pairs([], [str(empty)])
    one = tmp_path / "one.txt"
    one.write_text("acme sk-1\n")
    assert KeyRing.from_pairs([], [str(one)]) is not None
