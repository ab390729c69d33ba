"""Federation keeps the replica (docs/notes/fleet.md): Debian's prometheus scrapes two real kv-guardian
exporters as two replicas of one model (with the target labels a ServiceMonitor gives them), evaluates
deploy/prometheus/kvguardian-rules.yml, and a second prometheus federates its instance: and model: series. With
``honor_labels: true`` the global view keeps instance, pod, namespace and model, and the external label
``cluster`` says where they come from; with ``false`` the replica's instance is renamed ``exported_instance``
and ``instance`` becomes the federated Prometheus for every replica (why the docs advise ``true``)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from kvg_testing import ROOT, free_port, require_binary
from kvguardian.core.exporters.prometheus import KVGuardianCollector
from kvguardian.core.exporters.server import start_exporter
from kvguardian.core.ledger import Ledger

pytestmark = pytest.mark.services  # prometheus

RULES = ROOT / "deploy" / "prometheus" / "kvguardian-rules.yml"
MATCH = '{__name__=~"instance:kvguardian_.*|model:kvguardian_.*"}'
ORPHANED = 3 * 4096


class Prometheus:
    """One prometheus on 127.0.0.1 with ``config``, its data in ``folder``; stopped by `close`."""

    def __init__(self, folder: Path, config: dict) -> None:
        folder.mkdir()
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = (folder / "log").open("w")
        self.proc = subprocess.Popen(
            [require_binary("prometheus"), f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address={self.address}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[dict]:
        url = f"http://{self.address}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())["data"]["result"]

    def wait_for(self, expr: str, n: int, timeout: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = self.query(expr)
                if len(result) >= n:
                    return result
            except OSError:
                result = []
            assert self.proc.poll() is None, f"prometheus exited: {Path(self.log.name).read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"{expr}: {result}"
            time.sleep(0.25)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def replica(leaks: bool):
    """A ledger with one ended request whose KV is orphaned (``leaks``) or released, served on loopback."""
    ledger = Ledger()
    info = ledger.begin_request("r-1", tenant="t")
    ledger.add_entry(1, kind="block", nbytes=ORPHANED, request=info, source="test")
    ledger.end_request("r-1")
    if not leaks:
        ledger.release_entry(1)
    return start_exporter(collector=KVGuardianCollector(ledger), port=0)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("federation")
    exporters = {"kv-inference-a": replica(leaks=True), "kv-inference-b": replica(leaks=False)}
    started = []
    try:
        cluster = Prometheus(tmp / "cluster", {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "external_labels": {"cluster": "eu-1"}},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "kvguardian", "static_configs": [
                {"targets": [f"{e.host}:{e.port}"], "labels": {"namespace": "llm", "pod": pod, "model": "qwen"}}
                for pod, e in exporters.items()]}],
        })
        started.append(cluster)
        federate = {"metrics_path": "/federate", "params": {"match[]": [MATCH]},
                    "static_configs": [{"targets": [cluster.address]}]}
        global_view = Prometheus(tmp / "global", {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "federate", "honor_labels": True, **federate},
                               {"job_name": "federate-dishonored", "honor_labels": False, **federate}],
        })
        started.append(global_view)
        yield cluster, global_view, exporters
    finally:
        for p in started:
            p.close()
        for e in exporters.values():
            e.close()


def test_honor_labels_keeps_the_replica_and_the_cluster_tells_clusters_apart(fleet):
    cluster, global_view, exporters = fleet
    result = global_view.wait_for('instance:kvguardian_kv_orphaned_bytes:sum{job="federate"}', 2)
    got = {r["metric"]["pod"]: (r["metric"], float(r["value"][1])) for r in result}
    for pod, e in exporters.items():
        labels, value = got[pod]
        assert labels == {"__name__": "instance:kvguardian_kv_orphaned_bytes:sum", "job": "federate",
                          "cluster": "eu-1", "namespace": "llm", "pod": pod, "model": "qwen",
                          "instance": f"{e.host}:{e.port}"}
        assert value == (ORPHANED if pod.endswith("-a") else 0)
    (model,) = global_view.wait_for('model:kvguardian_kv_orphaned_bytes:sum{job="federate"}', 1)
    assert model["metric"] == {"__name__": "model:kvguardian_kv_orphaned_bytes:sum", "job": "federate",
                               "cluster": "eu-1", "namespace": "llm", "model": "qwen"}
    assert float(model["value"][1]) == ORPHANED
    local = cluster.query("instance:kvguardian_kv_orphaned_bytes:sum")  # external labels join at the boundary only
    assert len(local) == 2 and not any("cluster" in r["metric"] or "job" in r["metric"] for r in local)


def test_without_honor_labels_every_replica_gets_the_federated_prometheus_as_its_instance(fleet):
    cluster, global_view, exporters = fleet
    result = global_view.wait_for('instance:kvguardian_kv_orphaned_bytes:sum{job="federate-dishonored"}', 2)
    assert {r["metric"]["instance"] for r in result} == {cluster.address}
    assert {r["metric"]["exported_instance"] for r in result} == {f"{e.host}:{e.port}" for e in exporters.values()}
