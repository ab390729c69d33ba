"""One `kv-guardian watch vllm` over several replicas (`Fleet`), against real sockets: two HTTP servers serving
vLLM's exposition and two ZMQ publishers speaking vLLM's KV-event wire format. Each finding and each exported
series names its replica; a gap on one replica's stream leaves the other's index alone."""

import json
import subprocess
import sys
import threading
import urllib.request

import pytest

from engine_fakes import MetricsServer, VllmMetrics, VllmPublisher, stored, wait_until
from kvg_testing import ROOT, closing_factory, free_port, require_binary
from kvguardian.core.exporters.server import start_exporter
from kvguardian.runtime.engines.fleet import Fleet
from kvguardian.runtime.engines.watch import Watch, replica_name
from kvguardian.runtime.engines.watch_exporter import FleetCollector


class OtherModel(VllmMetrics):
    LABELS = {"model_name": "other-model", "engine": "0"}  # noqa: RUF012 - the fakes' class-level labels


@pytest.fixture
def servers():
    made = []

    def make(cls=VllmMetrics, **state):
        metrics = cls(num_gpu_blocks=101, block_size=4)
        metrics.set(**{"running": 1, "waiting": 0, "usage": 0.2, **state})
        made.append(MetricsServer(metrics.registry))
        return metrics, made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def publisher():
    with closing_factory(VllmPublisher) as make:
        yield make


class RunningFleet:
    def __init__(self, *replicas):
        self.fleet = Fleet([Watch("vllm", url, events=ev, replay=rep, interval=0.05, grace=0.3, replay_timeout=1.0)
                            for url, ev, rep in replicas])
        self.thread = threading.Thread(target=self.fleet.run, daemon=True)
        self.thread.start()

    def stop(self):
        self.fleet.stop()
        self.thread.join(10)
        self.fleet.close()
        return self.fleet.report()


def test_a_gap_on_one_replica_touches_only_its_index_and_findings_name_the_replica(servers, publisher):
    (_, a), (metrics_b, b) = servers(), servers(OtherModel)
    pub_a, pub_b = publisher(), publisher()
    run = RunningFleet((a.url, pub_a.endpoint, pub_a.replay_endpoint), (b.url, pub_b.endpoint, pub_b.replay_endpoint))
    wa, wb = run.fleet.watches
    try:
        pub_a.wait_for_subscriber()
        pub_b.wait_for_subscriber()
        for pub in (pub_a, pub_b):
            pub.publish([stored([1, 2])])
        pub_b.publish([stored([3], parent=2)], send=False, keep=False)  # lost on the wire and in the buffer
        for pub in (pub_a, pub_b):
            pub.publish([stored([4], parent=2)])
        assert wait_until(lambda: wa.subscriber.batches >= 2 and wb.subscriber.lost == 1)
        metrics_b.set(running=0, waiting=0, usage=0.2)  # b idles holding KV: KVG207 on b only
        assert wait_until(lambda: any(f.id == "KVG207" for f in wb.board.active()))
    finally:
        report = run.stop()
    by_replica = {r["replica"]: r for r in report.summary["replicas"]}
    ra, rb = by_replica[replica_name(a.url)], by_replica[replica_name(b.url)]
    assert ra["kv_events"]["gaps"] == 0 and ra["kv_events"]["lost"] == 0 and ra["incomplete"] is False
    assert ra["kv_events"]["index_blocks"] == 3  # 1, 2, 4
    assert rb["kv_events"]["gaps"] == 1 and rb["kv_events"]["lost"] == 1 and rb["incomplete"] is True
    assert (ra["model_name"], rb["model_name"]) == ("tiny-llama", "other-model")
    assert sorted((f.id, f.evidence["replica"]) for f in report.findings) == [
        ("KVG207", wb.replica), ("KVG209", wb.replica)]
    assert all(f.message.startswith(f"{wb.replica}: ") and f.evidence["model_name"] == "other-model"
               for f in report.findings)
    assert report.summary["incomplete"] is True


def test_a_partial_history_on_one_replica_leaves_the_others_history_whole(servers, publisher):
    (_, a), (_, b) = servers(), servers(OtherModel)
    pub_a, pub_b = publisher(), publisher(replay_limit=2)  # b's replay socket stalls after 2 of 3 batches
    for pub in (pub_a, pub_b):
        for h in (1, 2, 3):
            pub.publish([stored([h])])  # history: published before the watch joined, kept for replay
    run = RunningFleet((a.url, pub_a.endpoint, pub_a.replay_endpoint), (b.url, pub_b.endpoint, pub_b.replay_endpoint))
    wa, wb = run.fleet.watches
    try:
        pub_a.wait_for_subscriber()
        pub_b.wait_for_subscriber()
        for pub in (pub_a, pub_b):
            pub.publish([stored([4])])
        assert wait_until(lambda: wa.subscriber.history_complete is not None
                          and wb.subscriber.history_complete is not None)
    finally:
        report = run.stop()
    ra, rb = (r["kv_events"] for r in report.summary["replicas"])
    assert (ra["history_complete"], ra["index_blocks"], ra["replayed"]) == (True, 4, 3)
    assert (rb["history_complete"], rb["index_blocks"]) == (False, 1)  # b's live block only
    assert ra["gaps"] == rb["gaps"] == 0 and report.findings == []


def test_the_fleet_exporter_names_each_replica_and_model_on_every_series(servers, publisher):
    promtool = require_binary("promtool")
    (_, a), (_, b) = servers(), servers(OtherModel, running=0, usage=0.5)
    pub_a = publisher()
    run = RunningFleet((a.url, pub_a.endpoint, pub_a.replay_endpoint), (b.url, None, None))
    exporter = start_exporter(collector=FleetCollector(run.fleet), port=0)
    try:
        pub_a.wait_for_subscriber()
        pub_a.publish([stored([1, 2])])
        assert wait_until(lambda: any(f.id == "KVG207" for f in run.fleet.watches[1].board.active()))
        text = urllib.request.urlopen(exporter.url, timeout=5).read().decode()
    finally:
        exporter.close()
        run.stop()
    ra, rb = replica_name(a.url), replica_name(b.url)
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert all(line.startswith(("kvguardian_", "kvguardian_watch_")) for line in samples)
    mine = {ra: 'model_name="tiny-llama"', rb: 'model_name="other-model"'}
    assert all(any(f'replica="{r}"' in line and model in line for r, model in mine.items()) for line in samples), (
        [x for x in samples if "replica=" not in x][:3])
    kvg207 = [line for line in samples if line.startswith("kvguardian_findings{") and 'id="KVG207"' in line]
    assert sorted(kvg207) == sorted([  # prometheus_client writes labels in name order
        f'kvguardian_findings{{id="KVG207",model_name="tiny-llama",name="idle-kv-usage",replica="{ra}",'
        'severity="warning"} 0.0',
        f'kvguardian_findings{{id="KVG207",model_name="other-model",name="idle-kv-usage",replica="{rb}",'
        'severity="warning"} 1.0'])
    assert f'kvguardian_watch_prefix_index_blocks{{medium="GPU",model_name="tiny-llama",replica="{ra}"}} 2.0' in text
    assert "kvguardian_watch_kv_event_batches_total" not in "".join(x for x in samples if f'"{rb}"' in x)
    assert text.count("# TYPE kvguardian_findings gauge") == 1
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "kvguardian", "watch", "vllm", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_cli_watches_two_replicas_and_reports_each(servers):
    (_, a), (_, b) = servers(), servers(OtherModel, running=0, usage=0.1)
    proc = _cli("--metrics", a.url, "--metrics", b.url, "--interval", "0.1", "--grace", "0.3", "--duration", "1.5",
                "--json", "--fail-on", "warning")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert [r["replica"] for r in report["summary"]["replicas"]] == [replica_name(a.url), replica_name(b.url)]
    assert all(r["scrapes"] >= 5 for r in report["summary"]["replicas"])
    assert [(f["id"], f["evidence"]["replica"]) for f in report["findings"]] == [("KVG207", replica_name(b.url))]


def test_cli_text_mode_prefixes_each_replica(servers):
    (_, a), (_, b) = servers(), servers(OtherModel)
    proc = _cli("--metrics", a.url, "--metrics", b.url, "--interval", "0.1", "--duration", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"{replica_name(a.url)} (tiny-llama): watched vllm" in proc.stdout
    assert f"{replica_name(b.url)} (other-model): watched vllm" in proc.stdout
    assert f"watching vllm at {a.url}, {b.url}" in proc.stderr


def test_cli_one_unreachable_replica_exits_3_naming_it(servers):
    _, a = servers()
    gone = f"http://127.0.0.1:{free_port()}/metrics"
    proc = _cli("--metrics", a.url, "--metrics", gone, "--interval", "0.1", "--duration", "0.6", "--json")
    assert proc.returncode == 3
    assert f"no scrape of {gone} succeeded" in proc.stderr and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["summary"]["replicas"][0]["scrapes"] >= 1


def test_cli_binds_only_the_events_endpoint_named_by_events_bind(servers, publisher):
    """A fleet whose replicas publish both ways: one binds (the watcher connects), one connects (it binds)."""
    (_, a), (_, b) = servers(), servers(OtherModel)
    pub_a = publisher()
    bound = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "kvguardian", "watch", "vllm", "--metrics", a.url, "--metrics",
                             b.url, "--events", pub_a.endpoint, "--events", bound, "--events-bind", bound,
                             "--interval", "0.1", "--duration", "4", "--json"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pub_b = publisher(connect=bound)  # as vLLM given tcp://HOST:PORT: it connects, retrying until bound
    try:
        pub_a.wait_for_subscriber(timeout=30)
        pub_b.wait_for_subscriber(timeout=30)
        pub_a.publish([stored([1, 2])])
        pub_b.publish([stored([7])])
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    replicas = json.loads(out)["summary"]["replicas"]
    assert [(r["kv_events"]["bound"], r["kv_events"]["batches"]) for r in replicas] == [(False, 1), (True, 1)]


@pytest.mark.parametrize(("args", "message"), [
    (["--events", "tcp://127.0.0.1:5557"], "2 --metrics but 1 --events"),
    (["--events", "tcp://127.0.0.1:5557", "--events", "tcp://127.0.0.1:5559", "--replay", "tcp://127.0.0.1:5558"],
     "2 --events but 1 --replay"),
    (["--metrics", "http://127.0.0.1:9/metrics"], "names replica 127.0.0.1:9 twice"),
    (["--events", "tcp://127.0.0.1:5557", "--events", "tcp://127.0.0.1:5559", "--events-bind", "tcp://127.0.0.1:1"],
     "--events-bind 'tcp://127.0.0.1:1' is none of the --events"),
])
def test_cli_mismatched_replica_flags_are_one_line(args, message):
    proc = _cli("--metrics", "http://127.0.0.1:9/metrics", "--metrics", "http://127.0.0.1:10/metrics", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
