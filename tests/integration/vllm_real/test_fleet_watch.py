"""One `watch` over both real vLLM servers (`Fleet`): the clean one publishing on ipc:// (the watcher
connects), the faulty one on tcp://127.0.0.1:P (vLLM connects, the watcher binds). A gap made on the clean
replica's stream is repaired from its own replay socket and touches nothing of the faulty replica's index;
every finding names its replica."""

from __future__ import annotations

import random
import threading
import time

from relay import Relay

from engine_fakes import wait_until
from kvguardian.runtime.engines.fleet import Fleet
from kvguardian.runtime.engines.watch import Watch


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(3, 2047) for _ in range(300)]


def test_one_watch_follows_both_replicas_with_their_own_gaps(clean, faulty, servers):
    relay = Relay(clean.events, servers.run_dir, drop={3})  # the clean replica's 3rd message never arrives
    fleet = Fleet([
        Watch("vllm", clean.metrics_url, events=relay.endpoint, replay=clean.replay, topic="kv", interval=0.5,
              grace=3.0),
        Watch("vllm", faulty.metrics_url, events=servers.faulty_events, replay=faulty.replay, events_bind=True,
              topic="kv", interval=0.5, grace=3.0),
    ])
    wc, wf = fleet.watches
    thread = threading.Thread(target=fleet.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: wc.subscriber.ever_connected and wf.subscriber.ever_connected, timeout=15)
        time.sleep(0.5)
        for seed in range(4):  # one request per step: one batch each, on each replica
            clean.complete(_prompt(seed))
            faulty.complete(_prompt(seed))
        assert wait_until(lambda: relay.dropped and wc.subscriber.batches >= 4 and wf.subscriber.batches >= 4,
                          timeout=30), (relay.dropped, wc.subscriber.batches, wf.subscriber.batches)
        time.sleep(1.0)
    finally:
        fleet.stop()
        thread.join(30)
        fleet.close()
        relay.close()
    report = fleet.report()
    by = {r["replica"]: r for r in report.summary["replicas"]}
    c, f = by[f"127.0.0.1:{clean.port}"]["kv_events"], by[f"127.0.0.1:{faulty.port}"]["kv_events"]
    assert c["gaps"] == 1 and c["replayed"] >= 1 and c["lost"] == 0 and c["decode_errors"] == {}
    assert f["gaps"] == 0 and f["lost"] == 0 and f["bound"] is True and f["decode_errors"] == {}
    assert c["index_blocks"] > 0 and f["index_blocks"] > 0
    assert {r["model_name"] for r in report.summary["replicas"]} == {"tiny"}
    # the faulty replica may hold KV leaked by an earlier test (KVG207); nothing is ever put on the clean one
    assert all(x.evidence["replica"] == wf.replica and x.message.startswith(wf.replica) for x in report.findings), (
        [x.to_dict() for x in report.findings])
