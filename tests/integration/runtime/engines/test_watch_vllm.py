"""kv-guardian watch vllm against real sockets: an HTTP server serving vLLM's exposition and a ZMQ publisher
speaking vLLM's KV-event wire format (PUB + replay ROUTER)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import msgpack
import pytest

from engine_fakes import FORMATS, MetricsServer, VllmMetrics, VllmPublisher, removed, stored, vllm_serving, wait_until
from kvg_testing import ROOT, closing_factory, free_port, require_binary
from kvguardian.core.exporters.server import start_exporter
from kvguardian.runtime.engines.watch import Watch
from kvguardian.runtime.engines.watch_exporter import WatchCollector


@pytest.fixture
def vllm():
    with vllm_serving(num_gpu_blocks=101, block_size=4, running=2, waiting=0, usage=0.3) as pair:
        yield pair


@pytest.fixture
def publisher():
    with closing_factory(VllmPublisher) as make:
        yield make


class Running:
    """A Watch running in a background thread until stopped."""

    def __init__(self, **kw):
        self.watch = Watch("vllm", interval=0.05, grace=0.3, replay_timeout=1.0, **kw)
        self.thread = threading.Thread(target=self.watch.run, daemon=True)
        self.thread.start()

    def stop(self):
        self.watch.stop()
        self.thread.join(10)
        self.watch.close()
        return self.watch.report()


def applied(run, n):
    return wait_until(lambda: run.watch.subscriber.batches >= n)


@pytest.mark.parametrize("fmt", FORMATS)
def test_events_in_every_vllm_encoding_build_the_index(vllm, publisher, fmt):
    _, server = vllm
    pub = publisher(fmt=fmt)
    run = Running(metrics_url=server.url, events=pub.endpoint, replay=pub.replay_endpoint)
    pub.wait_for_subscriber()
    pub.publish([stored([1, 2, 3]), stored([4], parent=3)])
    pub.publish([removed([1, 99])])
    assert applied(run, 2)
    report = run.stop()
    ev = report.summary["kv_events"]
    assert ev["index_blocks"] == 3 and ev["events"] == {"BlockStored": 2, "BlockRemoved": 1}
    assert ev["anomalies"] == {"removal_of_unknown_hash": 1} and ev["decode_errors"] == {}
    assert ev["history_complete"] is True and not report.findings


@pytest.mark.parametrize("shape", ["0.32", "old"])
def test_a_gap_is_repaired_through_the_replay_socket(vllm, publisher, shape):
    _, server = vllm
    pub = publisher(reply_shape=shape)
    run = Running(metrics_url=server.url, events=pub.endpoint, replay=pub.replay_endpoint)
    pub.wait_for_subscriber()
    pub.publish([stored([1])])
    lost_on_wire = pub.publish([stored([2], parent=1)], send=False)  # buffered by the publisher, never sent
    pub.publish([stored([3], parent=2)])
    assert applied(run, 3)
    report = run.stop()
    assert pub.replay_requests == [lost_on_wire]
    ev = report.summary["kv_events"]
    assert (ev["gaps"], ev["replayed"], ev["lost"], ev["index_blocks"]) == (1, 1, 0, 3)
    assert ev["decode_errors"] == {} and not report.findings


@pytest.mark.parametrize("with_replay", [True, False])
def test_an_unrecoverable_gap_is_kvg209(vllm, publisher, with_replay):
    _, server = vllm
    pub = publisher()
    run = Running(metrics_url=server.url, events=pub.endpoint, replay=pub.replay_endpoint if with_replay else None)
    pub.wait_for_subscriber()
    pub.publish([stored([1])])
    pub.publish([stored([2])], send=False, keep=False)  # gone from the publisher's buffer too
    pub.publish([stored([3])])
    assert applied(run, 2) and wait_until(lambda: run.watch.board.active())
    report = run.stop()
    (f,) = report.findings
    assert f.id == "KVG209" and f.evidence["lost_total"] == 1 and f.evidence["replay_configured"] is with_replay
    assert report.summary["kv_events"]["incomplete"] is True


@pytest.mark.parametrize("shape", ["0.32", "old"])
def test_history_published_before_the_watch_started_is_fetched_once(vllm, publisher, shape):
    _, server = vllm
    pub = publisher(reply_shape=shape)
    for h in (1, 2, 3):
        pub.publish([stored([h])])  # nobody subscribed: dropped on the wire, kept in the replay buffer
    run = Running(metrics_url=server.url, events=pub.endpoint, replay=pub.replay_endpoint)
    pub.wait_for_subscriber()
    pub.publish([stored([4])])
    assert applied(run, 4)
    report = run.stop()
    assert pub.replay_requests == [0]
    ev = report.summary["kv_events"]
    assert ev["index_blocks"] == 4 and ev["history_complete"] is True and ev["gaps"] == 0


def test_a_history_that_comes_only_in_part_is_not_applied(publisher):
    """A slow replay (a long-running server, a loaded machine) that times out part-way must not leave the index
    holding blocks whose removals were in the batches that did not come: that over-counted past the pool (a
    false KVG208 on a real clean vLLM server in one fresh-clone run)."""
    with vllm_serving(num_gpu_blocks=4, block_size=4, running=0, waiting=0, usage=0.0) as (_, server):
        pub = publisher(replay_limit=6)
        for h in range(10, 16):
            pub.publish([stored([h])])  # history: six blocks stored ...
        pub.publish([removed(list(range(10, 15)))])  # ... and five removed (the part the replay never sends)
        run = Running(metrics_url=server.url, events=pub.endpoint, replay=pub.replay_endpoint)
        pub.wait_for_subscriber()
        pub.publish([stored([20])])
        assert applied(run, 1) and wait_until(lambda: run.watch.subscriber.history_complete is not None)
        report = run.stop()
    ev = report.summary["kv_events"]
    assert ev["history_complete"] is False and ev["index_blocks"] == 1  # the live block only
    assert [f.id for f in report.findings] == []


def test_a_history_slower_than_the_replay_timeout_but_still_coming_is_applied(publisher):
    """The replay timeout bounds the silence between replies, not the whole replay: a long-running server on a
    loaded machine answered its history steadily but took longer than the timeout, and it was dropped as partial
    (a restarted real-vLLM watcher then never recovered the history)."""
    with vllm_serving(num_gpu_blocks=101, block_size=4, running=0, waiting=0, usage=0.0) as (_, server):
        pub = publisher(replay_delay=0.3)  # 6 batches in about 1.8 s; Running's replay_timeout is 1.0 s
        for h in range(10, 16):
            pub.publish([stored([h])])
        run = Running(metrics_url=server.url, events=pub.endpoint, replay=pub.replay_endpoint)
        pub.wait_for_subscriber()
        pub.publish([stored([20])])
        assert applied(run, 1) and wait_until(lambda: run.watch.subscriber.history_complete is not None)
        report = run.stop()
    ev = report.summary["kv_events"]
    assert ev["history_complete"] is True and ev["replayed"] == 6 and ev["index_blocks"] == 7


def test_a_restarted_publisher_resets_the_index(vllm, publisher):
    _, server = vllm
    first = publisher()
    run = Running(metrics_url=server.url, events=first.endpoint)
    first.wait_for_subscriber()
    first.publish([stored([1, 2])])
    first.publish([stored([3])])
    assert applied(run, 2)
    port, replay_port = first.port, first.replay_port
    first.close()
    second = publisher(port=port, replay_port=replay_port)  # the engine restarted: sequences start at 0 again
    second.wait_for_subscriber()
    second.publish([stored([7])])
    assert applied(run, 3)
    report = run.stop()
    ev = report.summary["kv_events"]
    assert ev["index_blocks"] == 1 and ev["clears"] == 1 and ev["restarts"] == 1
    assert set(ev["events"]) == {"BlockStored"}  # a restart is not an event type


def test_malformed_frames_on_the_wire_are_counted_and_the_stream_goes_on(vllm, publisher):
    _, server = vllm
    pub = publisher()
    run = Running(metrics_url=server.url, events=pub.endpoint)
    pub.wait_for_subscriber()
    pub.send_raw([b"", b"\x00" * 8])  # two frames
    pub.send_raw([b"", b"\x01\x02", b"payload"])  # a 2-byte sequence
    pub.send_raw([b"", (0).to_bytes(8, "big"), b"\xc1 not msgpack"])
    pub.send_raw([b"", (1).to_bytes(8, "big"), msgpack.packb([2.0, [["Gossip", [1]]], None])])  # a future event type
    pub.seq = 2
    pub.publish([stored([5])])
    assert applied(run, 3)
    report = run.stop()
    ev = report.summary["kv_events"]
    assert ev["decode_errors"] == {"frames": 1, "sequence": 1, "payload": 1, "unknown_type": 1}
    assert ev["index_blocks"] == 1


def test_idle_leak_capacity_and_reload_findings_reach_the_exporter(vllm, publisher):
    promtool = require_binary("promtool")
    _, server = vllm
    metrics_small = VllmMetrics(num_gpu_blocks=4, block_size=4)  # 3 cacheable blocks
    metrics_small.set(running=1, waiting=0, usage=0.5)
    server.registry = metrics_small.registry
    pub = publisher()
    run = Running(metrics_url=server.url, events=pub.endpoint, replay=pub.replay_endpoint)
    exporter = start_exporter(collector=WatchCollector(run.watch), port=0)
    try:
        pub.wait_for_subscriber()
        pub.publish([stored([1, 2, 3])])
        pub.publish([stored([4], parent=3)])  # 4 blocks cached in a pool that can cache 3
        assert wait_until(lambda: any(f.id == "KVG208" for f in run.watch.board.active()))
        metrics_small.set(running=0, waiting=0, usage=0.25)  # idle, one block still referenced
        assert wait_until(lambda: any(f.id == "KVG207" for f in run.watch.board.active()))
        metrics_small.set_sleep("discard_all")
        assert wait_until(lambda: run.watch.vllm._engines and not next(iter(run.watch.vllm._engines.values())).awake)
        metrics_small.set_sleep("awake")
        assert wait_until(lambda: run.watch.audit._woke_at is not None)
        assert not any(f.id == "KVG105" for f in run.watch.board.active())  # the clear may come with the next step
        pub.publish([stored([9], parent=4)])  # the next step's batch: no AllBlocksCleared in it
        assert wait_until(lambda: any(f.id == "KVG105" for f in run.watch.board.active()))
        text = urllib.request.urlopen(exporter.url, timeout=5).read().decode()
    finally:
        exporter.close()
    report = run.stop()
    for fid, sev in (("KVG207", "warning"), ("KVG208", "warning"), ("KVG105", "error")):  # the catalog's
        assert f'kvguardian_findings{{id="{fid}",name=' in text
        line = next(x for x in text.splitlines() if x.startswith(f'kvguardian_findings{{id="{fid}"'))
        assert f'severity="{sev}"' in line and line.endswith(" 1.0"), line
    assert 'kvguardian_watch_prefix_index_blocks{medium="GPU"} 5.0' in text
    assert {f.id for f in report.findings} >= {"KVG105", "KVG207", "KVG208"}
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------- the command


def _cli(*args):
    return [sys.executable, "-m", "kvguardian", "watch", *args]


def test_cli_json_report_and_exit_code(vllm):
    metrics, server = vllm
    metrics.set(running=0, waiting=0, usage=0.1)
    proc = subprocess.run(_cli("vllm", "--metrics", server.url, "--interval", "0.1", "--grace", "0.3",
                               "--duration", "1.5", "--json", "--fail-on", "warning"),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert [f["id"] for f in report["findings"]] == ["KVG207"] and report["summary"]["scrapes"] >= 5
    assert proc.stderr == ""


def test_cli_ctrl_c_still_prints_the_report(vllm):
    _, server = vllm
    proc = subprocess.Popen(_cli("vllm", "--metrics", server.url, "--interval", "0.1"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    assert proc.stderr is not None
    assert "watching vllm at" in proc.stderr.readline()
    time.sleep(0.5)  # a few scrapes
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "0 finding(s)" in out and "Traceback" not in err and "interrupted" not in err


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--metrics", "ftp://host/metrics"], 2, "is not an http(s) URL"),
    (["--metrics", "http://127.0.0.1:9/metrics", "--events", "tcp://*:5557", "--events-bind"], 2,
     "binds every interface"),
    (["--metrics", "http://127.0.0.1:9/metrics", "--events", "ipc:///tmp/x.sock", "--events-bind"], 2,
     "vLLM binds ipc://"),
    (["--metrics", "http://127.0.0.1:9/metrics", "--events-bind"], 2, "--events-bind needs --events"),
    (["--metrics", "http://127.0.0.1:9/metrics", "--replay", "tcp://127.0.0.1:5558"], 2, "--replay needs --events"),
    (["--metrics", "http://127.0.0.1:9/metrics", "--interval", "0"], 2, "must be > 0"),
])
def test_cli_bad_input_is_one_line(args, code, message):
    proc = subprocess.run(_cli("vllm", *args), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == code
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_cli_unreachable_server_prints_the_report_then_exits_3():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    proc = subprocess.run(_cli("vllm", "--metrics", url, "--interval", "0.1", "--duration", "0.5", "--json"),
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 3
    assert json.loads(proc.stdout)["summary"]["scrape_errors"]["connect"] >= 1
    assert "no scrape of" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_pointed_at_another_server_says_so():
    from engine_fakes import SglangMetrics

    server = MetricsServer(SglangMetrics().registry)
    try:
        proc = subprocess.run(_cli("vllm", "--metrics", server.url, "--duration", "1"), capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
    finally:
        server.close()
    assert proc.returncode == 2 and "has no vllm:kv_cache_usage_perc" in proc.stderr


def test_cli_serves_its_metrics_while_watching(vllm):
    _, server = vllm
    port = free_port()
    proc = subprocess.Popen(_cli("vllm", "--metrics", server.url, "--interval", "0.1", "--duration", "20",
                                 "--exporter-port", str(port)), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "300"})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"metrics on http://127.0.0.1:{port}/metrics" in line, line
        assert wait_until(lambda: b'kvguardian_watch_scrapes_total{engine="vllm"} 0' not in
                          urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read())
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert 'kvguardian_findings{id="KVG207",name="idle-kv-usage",severity="warning"} 0.0' in body
    assert 'kvguardian_watch_idle_kv_seconds{engine="vllm"} 0.0' in body
