"""Stand-ins for vLLM and SGLang that speak their real wire formats over real sockets (no GPU needed).

- `MetricsServer`: a real HTTP server on a free loopback port serving a prometheus_client registry, which is
  how vLLM and SGLang expose ``/metrics`` (same library, same exposition format).
- `VllmMetrics` / `SglangMetrics`: registries with the engines' metric names, types, labels and HELP texts.
- `VllmPublisher`: a ZMQ publisher with a replay ROUTER socket behaving like vLLM's ``ZmqEventPublisher``
  (multipart ``topic / 8-byte big-endian sequence / msgpack batch``; replay answers ``seq >= start`` then an
  end marker with sequence -1, in vLLM 0.32's 4-frame shape or the older 3-frame one), batches encoded
  with msgspec structs shaped like vLLM's, in the three encodings vLLM has shipped. It binds an XPUB socket
  (wire-compatible with PUB) only so tests can wait for the subscriber to join instead of sleeping.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import msgspec
import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvg_testing import free_port

# ---------------------------------------------------------------------------------------------- HTTP


class MetricsServer:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(outer.registry) if outer.status == 200 else b"nope\n"
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class VllmMetrics:
    """vLLM v1's metric families for one engine (labels model_name, engine)."""

    LABELS: ClassVar[dict[str, str]] = {"model_name": "tiny-llama", "engine": "0"}

    def __init__(self, num_gpu_blocks: int = 1001, block_size: int = 16) -> None:
        self.registry = CollectorRegistry()
        names = list(self.LABELS)
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                             names, registry=r).labels(**self.LABELS)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                             names, registry=r).labels(**self.LABELS)
        self.usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                           names, registry=r).labels(**self.LABELS)
        self.queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
                               "tokens.", names, registry=r).labels(**self.LABELS)
        self.hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                            names, registry=r).labels(**self.LABELS)
        info = {"block_size": str(block_size), "cache_dtype": "auto", "enable_prefix_caching": "True",
                "gpu_memory_utilization": "0.9", "num_cpu_blocks": "None", "num_gpu_blocks": str(num_gpu_blocks),
                "num_gpu_blocks_override": "None", "sliding_window": "None", "engine": "0"}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info),
              registry=r).labels(**info).set(1)
        self._sleep = Gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; "
                            "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
                            "discard_all = 1 means sleep level 2.", [*names, "sleep_state"], registry=r)
        self.set_sleep("awake")

    def set(self, running: int, waiting: int, usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.usage.set(usage)

    def set_sleep(self, state: str) -> None:
        """``awake``, ``weights_offloaded`` (sleep level 1) or ``discard_all`` (level 2), set as vLLM does."""
        self._sleep.labels(**self.LABELS, sleep_state="awake").set(1 if state == "awake" else 0)
        for s in ("weights_offloaded", "discard_all"):
            self._sleep.labels(**self.LABELS, sleep_state=s).set(1 if s == state else 0)


@contextlib.contextmanager
def vllm_serving(*, num_gpu_blocks: int, block_size: int, running: int, waiting: int,
                 usage: float) -> Iterator[tuple[VllmMetrics, MetricsServer]]:
    """``(metrics, server)``: a `VllmMetrics` in this state served over HTTP for the block."""
    metrics = VllmMetrics(num_gpu_blocks=num_gpu_blocks, block_size=block_size)
    metrics.set(running=running, waiting=waiting, usage=usage)
    server = MetricsServer(metrics.registry)
    try:
        yield metrics, server
    finally:
        server.close()


class SglangMetrics:
    """SGLang's scheduler gauges for one rank (labels model_name, tp_rank...)."""

    LABELS: ClassVar[dict[str, str]] = {
        "model_name": "tiny-llama", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "dp_rank": "0",
    }

    def __init__(self, total: int = 10_000) -> None:
        self.registry = CollectorRegistry()
        names, r = list(self.LABELS), self.registry

        def g(name: str, doc: str) -> Any:
            return Gauge(name, doc, names, registry=r).labels(**self.LABELS)

        self.total = g("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.")
        self.available = g("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.")
        self.evictable = g("sglang:kv_evictable_tokens",
                           "Number of evictable (radix-cached) token slots in the KV cache pool.")
        self.used = g("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.")
        self.num_used = g("sglang:num_used_tokens", "The number of used tokens.")
        self.running = g("sglang:num_running_reqs", "The number of running requests.")
        self.queued = g("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.total.set(total)
        self.set(available=total, evictable=0, used=0, running=0, queued=0)

    def set(self, *, available: int, evictable: int, used: int, running: int, queued: int) -> None:
        self.available.set(available)
        self.evictable.set(evictable)
        self.used.set(used)
        self.num_used.set(used)
        self.running.set(running)
        self.queued.set(queued)


# ---------------------------------------------------------------------------------------------- ZMQ (vLLM)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # vLLM: batch stays an array
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class MapBatch(msgspec.Struct, omit_defaults=True, gc=False):  # the newest source: the batch is a map too
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # after vLLM PR #42892: tagged maps
    pass


class BlockStored(_Event):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(_Event):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(_Event):
    pass


class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):  # vLLM <= 0.23
    pass


class LegacyBlockStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class LegacyBlockRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class LegacyAllBlocksCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


FORMATS = ("map-events", "array", "map")
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(hashes: list[int], parent: int | None = None, *, block_size: int = 4, salt: str | None = None,
           tokens: list[int] | None = None, medium: str = "GPU") -> dict[str, Any]:
    tokens = tokens if tokens is not None else [h % 1000 for h in hashes for _ in range(block_size)]
    extra = [((salt,) if salt and i == 0 and parent is None else None) for i in range(len(hashes))]
    return {"type": "BlockStored", "hashes": hashes, "parent": parent, "tokens": tokens, "block_size": block_size,
            "extra": extra, "medium": medium}


def removed(hashes: list[int], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "hashes": hashes, "medium": medium}


CLEARED: dict[str, Any] = {"type": "AllBlocksCleared"}


def encode(events: list[dict[str, Any]], fmt: str = "map-events", ts: float | None = None) -> bytes:
    structs: list[Any] = []
    for e in events:
        if e["type"] == "BlockStored":
            structs.append(
                LegacyBlockStored(e["hashes"], e["parent"], e["tokens"], e["block_size"], None, e["medium"])
                if fmt == "array" else
                BlockStored(e["hashes"], e["parent"], e["tokens"], e["block_size"], None, e["medium"], None,
                            e["extra"], 0, "full_attention"))
        elif e["type"] == "BlockRemoved":
            structs.append(LegacyBlockRemoved(e["hashes"], e["medium"]) if fmt == "array"
                           else BlockRemoved(e["hashes"], e["medium"], 0))
        else:
            structs.append(LegacyAllBlocksCleared() if fmt == "array" else AllBlocksCleared())
    batch_cls = MapBatch if fmt == "map" else EventBatch
    return msgspec.msgpack.encode(batch_cls(ts if ts is not None else time.time(), structs, 0))


class VllmPublisher:
    """PUB (as XPUB) + replay ROUTER on free loopback ports; sequence numbers from 0, a bounded replay buffer."""

    def __init__(self, fmt: str = "map-events", topic: str = "", buffer_steps: int = 10_000,
                 port: int | None = None, replay_port: int | None = None, reply_shape: str = "0.32",
                 connect: str | None = None, replay_limit: int | None = None, replay_delay: float = 0.0) -> None:
        self.fmt = fmt
        self.replay_limit = replay_limit  # answer at most this many batches, then stall (a slow replay)
        self.replay_delay = replay_delay  # seconds before each replayed batch (a loaded server, still answering)
        self.reply_shape = reply_shape  # "0.32": (b"", topic, seq, payload); "old" (and SGLang): (b"", seq, payload)
        self.topic = topic.encode()
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = port or free_port()
        if connect:  # as vLLM with a tcp://HOST:PORT endpoint: it connects to the (bound) subscriber
            self.pub.connect(connect)
        else:
            self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.replay_port = replay_port or free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.replay_endpoint = f"tcp://127.0.0.1:{self.replay_port}"
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self.seq = 0
        self.replay_requests: list[int] = []
        self._stop = threading.Event()
        self._router_ready = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()
        self._router_ready.wait(5)

    def wait_for_subscriber(self, timeout: float = 5.0) -> None:
        if not self.pub.poll(int(timeout * 1000)):
            raise TimeoutError("no subscriber joined the publisher")
        self.pub.recv()  # the subscription message

    def publish(self, events: list[dict[str, Any]], *, send: bool = True, keep: bool = True) -> int:
        """Publish one batch. ``send=False``: lost on the wire but kept for replay; ``keep=False``: not buffered
        either (unrecoverable). Returns its sequence number."""
        payload = encode(events, self.fmt)
        with self._lock:
            seq = self.seq
            self.seq += 1
            if keep:
                self._buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def send_raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def _serve_replay(self) -> None:
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.replay_endpoint)
        self._router_ready.set()
        try:
            while not self._stop.is_set():
                if not router.poll(50):
                    continue
                frames = router.recv_multipart()
                if len(frames) != 3:  # vLLM: "Invalid replay request"
                    continue
                client, _, start_bytes = frames
                start = int.from_bytes(start_bytes, "big")
                self.replay_requests.append(start)
                with self._lock:
                    items = [(s, p) for s, p in self._buffer if s >= start]
                topic = [self.topic] if self.reply_shape == "0.32" else []
                if self.replay_limit is not None and len(items) > self.replay_limit:
                    items = items[:self.replay_limit]  # the rest never comes in time: no end marker either
                    for seq, payload in items:
                        router.send_multipart([client, b"", *topic, seq.to_bytes(8, "big"), payload])
                    continue
                for seq, payload in items:
                    self._stop.wait(self.replay_delay)
                    router.send_multipart([client, b"", *topic, seq.to_bytes(8, "big"), payload])
                router.send_multipart([client, b"", *([b""] if topic else []), END_SEQ, b""])
        finally:
            router.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pub.close(linger=0)
        self.ctx.term()


def wait_until(predicate: Any, timeout: float = 10.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())
