"""The exports: our KV history as a PyTorch memory snapshot that PyTorch's own viewer reads, and as a Chrome /
Perfetto trace (checked structurally: the format's rules for each event type)."""

from __future__ import annotations

import base64
import itertools
import json
import pickle
import pickletools
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from kvg_reports import BYTES_PER_LAYER, LAYERS, synthetic_report
from kvguardian.apps.cli import main

# the opcodes the viewer's JavaScript unpickler (torch/utils/viz/MemoryViz.js) implements
VIEWER_OPCODES = {"PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "SETITEM", "SETITEMS",
                  "APPEND", "APPENDS", "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "DICT", "NONE", "NEWTRUE",
                  "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
                  "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET"}


@pytest.fixture
def report_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(synthetic_report(60, leak_every=6)))
    return path


def _viz(*args):
    proc = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *map(str, args)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_memory_snapshot_renders_in_pytorchs_memory_viewer(tmp_path, report_file):
    pytest.importorskip("torch")
    snap_path = tmp_path / "kv.pickle"
    assert main(["report", str(report_file), "--memory-snapshot", str(snap_path)]) == 0
    raw = snap_path.read_bytes()
    assert {op.name for op, _, _ in pickletools.genops(raw)} <= VIEWER_OPCODES
    snap = pickle.loads(raw)
    leaked = 10  # requests 0, 6, ..., 54
    assert len(snap["segments"]) == leaked * LAYERS * 2
    trace = snap["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    frees = [e for e in trace if e["action"] == "free_completed"]
    assert len(allocs) == 60 * LAYERS * 2 and len(frees) == 50 * LAYERS * 2
    assert all(e["size"] == BYTES_PER_LAYER and e["frames"] for e in allocs)
    assert [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)

    out = tmp_path / "kv.html"
    _viz("trace_plot", snap_path, "-o", out)  # the command the README gives
    page = out.read_text()
    assert "Active Memory Timeline" in page
    files = json.loads(re.search(r"const local_files = (\[.*?\])\n", page).group(1))
    embedded = base64.b64decode(files[0]["base64"]).rstrip(b"\x00")
    assert pickle.loads(embedded) == snap  # the viewer gets exactly our snapshot

    from torch.cuda import _memory_viz as viz  # what `python -m torch.cuda._memory_viz trace|stats` print

    printed = viz.trace(pickle.loads(raw))  # PyTorch's own reading of the alloc/free sequence
    assert f"{len(trace)} entries" in printed
    assert len(re.findall(r"^\w+ = (?:seg_\d+|MEM)\[\d+:8\.0KiB\]$", printed, re.M)) == len(allocs)
    assert len(re.findall(r"^\w+ = seg_\d+\[0:", printed, re.M)) == leaked * LAYERS * 2  # alive: in a segment
    assert len(re.findall(r"^del \w+ # 8\.0KiB$", printed, re.M)) == len(frees)
    stats = viz.segsum(pickle.loads(raw))  # checks every segment's blocks add up (it raises if not)
    assert f"segments: {leaked * LAYERS * 2}" in stats
    assert "held by" in repr(snap["segments"][0]["blocks"][0]["frames"])  # the holder chain as the stack


def _check_trace(doc):
    """The Chrome trace-event format's rules, as viewers apply them."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    spans = defaultdict(list)
    async_open = {}
    names = {}
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int), e
        ph = e["ph"]
        assert ph in {"X", "C", "i", "M", "b", "e"}, e
        if ph == "M":
            assert e["name"] in ("process_name", "thread_name") and isinstance(e["args"]["name"], str)
            names[(e["pid"], e.get("tid"), e["name"])] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if ph == "X":
            assert e["dur"] >= 0 and isinstance(e["tid"], int)
            spans[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif ph == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        elif ph == "i":
            assert e["s"] in ("t", "p", "g")
        elif ph == "b":
            key = (e["pid"], e["cat"], e["id"], e["name"])
            assert key not in async_open
            async_open[key] = e["ts"]
        elif ph == "e":
            key = (e["pid"], e["cat"], e["id"], e["name"])
            assert async_open.pop(key) <= e["ts"]
    assert not async_open, "async spans without their end"
    for track, items in spans.items():  # complete events on one thread must not partly overlap
        items.sort()
        for (_, end), (start, _) in itertools.pairwise(items):
            assert start >= end - 1e-3, (track, end, start)
    return spans, names


def test_trace_is_a_valid_chrome_trace(tmp_path, report_file):
    out = tmp_path / "kv-trace.json"
    assert main(["report", str(report_file), "--trace", str(out)]) == 0
    doc = json.loads(out.read_text())
    spans, names = _check_trace(doc)
    events = doc["traceEvents"]
    requests = [e for e in events if e["ph"] == "X" and e["cat"] == "request"]
    assert sorted(e["name"] for e in requests) == sorted(f"r-{i}" for i in range(60))
    tails = [e for e in events if e["ph"] == "b"]
    assert sorted(e["name"] for e in tails) == sorted(f"KV after end: r-{i}" for i in range(0, 60, 6))
    counters = [e for e in events if e["ph"] == "C" and e["name"] == "KV bytes"]
    assert counters and set(counters[0]["args"]) == {"live", "retained", "orphaned"}
    assert counters[-1]["args"]["orphaned"] == 10 * LAYERS * 2 * BYTES_PER_LAYER
    assert any(v.startswith("kv-guardian KV") for v in names.values())
    assert {e["name"] for e in events if e.get("cat") == "finding"} == {"KVG102 orphaned-kv"}
    assert len(spans) <= 3  # sequential requests share one lane (a few overlap at the edges)


def test_exports_need_a_timeline(tmp_path, capsys):
    path = tmp_path / "scan.json"
    path.write_text(json.dumps({"schema": "kv-guardian/redis-scan", "version": 1, "target": "t", "started": 1,
                                "finished": 2, "patterns": [], "findings": []}))
    html = tmp_path / "r.html"
    assert main(["report", str(path), "-o", str(html), "--trace", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "has no KV timeline" in err and err.count("\n") == 1
    assert not html.exists()  # every output is checked before anything is written
    assert main(["report", str(path)]) == 2
    assert "nothing to write" in capsys.readouterr().err


def test_an_output_that_cannot_be_written_is_named_and_loses_none_of_the_others(tmp_path, report_file, capsys):
    """A full disk under -o stopped the exports after it (the trace was never written) and the line said
    "cannot write the output ... (-o FILE)" whichever one failed; `run --html /dev/full` said only "error: No
    space left on device"."""
    trace = tmp_path / "kv-trace.json"
    assert main(["report", str(report_file), "-o", "/dev/full", "--trace", str(trace)]) == 3
    err = capsys.readouterr().err
    assert "cannot write -o /dev/full: No space left on device" in err and "Traceback" not in err
    assert f"wrote {trace}" in err and _check_trace(json.loads(trace.read_text()))
    assert main(["report", str(report_file), "-o", str(tmp_path / "r.html"), "--trace", "/dev/full"]) == 3
    err = capsys.readouterr().err
    assert "cannot write --trace /dev/full" in err and "cannot write -o" not in err and (tmp_path / "r.html").exists()


def test_run_names_the_view_it_could_not_write_and_keeps_the_programs_code(capsys):
    assert main(["run", "--html", "/dev/full", "--", sys.executable, "-c", "import sys; sys.exit(4)"]) == 4
    assert "cannot write --html /dev/full: No space left on device" in capsys.readouterr().err


def test_an_html_page_written_to_a_fifo_or_through_a_link_keeps_them(tmp_path):
    """The page was written to a temporary file renamed over the path: `--html /dev/full` (as root) replaced
    the device with a regular file for every program on the machine, `--html /dev/stdout` the link, a FIFO
    became a file and a symbolic link was cut from its target. Only a regular file is replaced whole."""
    import os
    import stat
    import threading

    from kvguardian.core.report.html.reporter import html_file

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    html_file(fifo).close()
    reader.join(30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got and got[0].startswith(b"<!DOCTYPE html>")
    real = tmp_path / "real.html"
    real.write_text("old")
    (tmp_path / "link.html").symlink_to(real)
    html_file(tmp_path / "link.html").close()
    assert (tmp_path / "link.html").is_symlink() and real.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.html", "pipe", "real.html"]  # no temporary left


def test_a_credential_left_in_a_report_files_url_is_masked_when_it_is_shown_again(tmp_path, capsys):
    """A scan JSON from an older or another writer with redis://user:PASSWORD@… in "target" was shown as
    it stood by `report` (the HTML page) and by `redis diff` / `--compare` (every line)."""
    from kvguardian.keyspace.result import ScanResult, load_result

    scan = ScanResult(target="redis://bob:pw-Hunter7@10.0.0.1:6379/0?password=pw-Hunter8", started=1).to_dict()
    scan["target"] = "redis://bob:pw-Hunter7@10.0.0.1:6379/0?password=pw-Hunter8"  # as an unmasking writer left it
    path = tmp_path / "scan.json"
    path.write_text(json.dumps(scan))
    html = tmp_path / "r.html"
    assert main(["report", str(path), "-o", str(html)]) == 0
    page = html.read_text()
    assert "Hunter" not in page + capsys.readouterr().err and "redis://bob:***@10.0.0.1" in page
    assert "Hunter" not in load_result(path).to_json()
