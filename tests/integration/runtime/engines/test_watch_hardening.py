"""Issue 13 on `kv-guardian watch`: hostile label values, servers that do not speak (good) HTTP, arguments
that must be refused. Real HTTP servers on loopback (engine_fakes, kvg_hostile); each failed before the fix."""

import json
import subprocess
import sys

import pytest

from engine_fakes import MetricsServer, VllmMetrics
from kvg_hostile import HostileServer
from kvg_testing import ROOT

CONTROL = [chr(c) for c in range(32) if c != 10] + ["\x7f", "\u202e"]


def _watch(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "kvguardian", "watch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


class HostileVllm(VllmMetrics):
    LABELS = {"model_name": "[/x][bold]m[/]\x1b[2J\nkv-guardian: all clear\u202e", "engine": "0"}  # noqa: RUF012


@pytest.mark.parametrize("json_out", [False, True])
def test_markup_and_control_characters_in_label_values_are_shown_escaped(json_out):
    """Items 6 and 7: a model_name label containing '[/x]' crashed the final report (MarkupError, rc 70)."""
    metrics = HostileVllm()
    metrics.set(running=0, waiting=0, usage=0.2)  # idle with KV in use: KVG207 after the grace
    server = MetricsServer(metrics.registry)
    try:
        proc = _watch("vllm", "--metrics", server.url, "--interval", "0.1", "--grace", "0.2", "--duration", "1.5",
                      *(["--json"] if json_out else []))
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout + proc.stderr
    assert not [c for c in text if c in CONTROL], "no raw control character reaches the terminal"
    assert not any(line.startswith("kv-guardian: all clear") for line in text.splitlines())
    if json_out:
        (f,) = json.loads(proc.stdout)["findings"]
        assert f["evidence"]["engine_labels"]["model_name"] == HostileVllm.LABELS["model_name"]
    else:
        assert "KVG207 idle-kv-usage (warning)" in proc.stdout and "[/x][bold]m[/]\\x1b[2J\\n" in proc.stdout


@pytest.mark.parametrize("mode, why", [("not-http", "not a valid HTTP answer (BadStatusLine)"),
                                       ("long-header", "not a valid HTTP answer (LineTooLong)"),
                                       ("truncated", "sent 36 of the 1000 bytes it announced"),
                                       ("garbage", "not a valid HTTP answer")])
def test_servers_that_do_not_speak_good_http_are_scrape_errors(mode, why):
    """Item 13/14: BadStatusLine and LineTooLong were internal errors (rc 70); a truncated body was parsed
    without complaint."""
    with HostileServer(mode) as server:
        proc = _watch("sglang", "--metrics", server.url, "--interval", "0.2", "--duration", "1", "--json")
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["summary"]["scrapes"] == 0 and report["summary"]["scrape_errors"]["http"] >= 1
    assert why in report["summary"]["last_scrape_error"]
    assert "internal error" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--metrics", "http://127.0.0.1:99999/metrics"], "Port out of range"),
    (["--metrics", "http://127.0.0.1:9/metrics", "--grace", "nan"], "must be >= 0 (a finite number)"),
    (["--metrics", "http://127.0.0.1:9/metrics", "--interval", "inf"], "must be > 0 (a finite number)"),
    (["--metrics", "http://127.0.0.1:9/metrics", "--exporter-port", "70000"], "--exporter-port 70000 is not"),
])
def test_arguments_that_cannot_work_are_refused(args, message):
    """Items 13 and 14: a port 99999 was reported as "Connection refused", --grace nan was accepted."""
    proc = _watch("sglang", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_zmq_garbage_on_the_event_stream_is_counted_and_the_watch_goes_on():
    """The hostile kit's ZMQ publisher: frames that are not KV events never crash or stall the watch."""
    from kvg_hostile import zmq_garbage
    from kvg_testing import free_port

    metrics = VllmMetrics()
    metrics.set(running=1, waiting=0, usage=0.1)
    server = MetricsServer(metrics.registry)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sender = zmq_garbage(endpoint, count=300, seconds=6.0)
    try:
        proc = _watch("vllm", "--metrics", server.url, "--events", endpoint, "--interval", "0.2", "--duration", "3",
                      "--json")
    finally:
        server.close()
        sender.join(10)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(proc.stdout)["summary"]["kv_events"]
    assert sum(events["decode_errors"].values()) > 0 and events["index_blocks"] == 0
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


def test_credentials_in_the_metrics_url_appear_nowhere(tmp_path):
    """A password in the userinfo or a ?token= of --metrics was printed in the 'watching' line, the error
    line, the JSON summary's metrics_url and the HTML page (Redis URLs were masked, watch URLs were not)."""
    metrics = VllmMetrics()
    metrics.set(running=0, waiting=0, usage=0.2)
    server = MetricsServer(metrics.registry)
    url = server.url.replace("http://", "http://me:pw-Secret1@") + "?access_token=tok-Secret2&api_key=k-Secret3"
    try:
        proc = _watch("vllm", "--metrics", url, "--interval", "0.1", "--grace", "0.2", "--duration", "1",
                      "--json", "--html", str(tmp_path / "w.html"))
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["summary"]["metrics_url"].startswith("http://me:***@127.0.0.1:")
    gone = _watch("vllm", "--metrics", "http://me:pw-Secret1@127.0.0.1:1/metrics?token=tok-Secret2",
                  "--duration", "0.5")
    assert gone.returncode == 3 and "cannot reach" in gone.stderr
    for text in (proc.stdout, proc.stderr, (tmp_path / "w.html").read_text(), gone.stdout, gone.stderr):
        assert "Secret" not in text
