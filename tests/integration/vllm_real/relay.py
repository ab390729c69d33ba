"""A KV-event relay between a real vLLM server and a watcher that drops chosen messages (a sequence gap)."""

from __future__ import annotations

import threading

import zmq


class Relay:
    """Re-publishes the server's KV events on another ipc socket, dropping the messages whose positions are in
    ``drop`` (1-based), so the watcher behind it sees a sequence gap."""

    def __init__(self, source: str, run_dir, drop: set[int], hold: int = 0) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        if source.startswith("ipc://"):
            self.sub.connect(source)
        else:  # the publisher connects (tcp://127.0.0.1:P): the relay binds for it
            self.sub.bind(source)
        self.pub = self.ctx.socket(zmq.XPUB)
        self.endpoint = f"ipc://{run_dir}/relay-{id(self)}.sock"
        self.pub.bind(self.endpoint)
        self.drop, self.hold = drop, hold
        self.seen = 0
        self.dropped: list[int] = []
        self._held: list[list[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.pub.poll(0):
                self.pub.recv()  # a subscription from the watcher
            if not self.sub.poll(50):
                continue
            frames = self.sub.recv_multipart()
            self.seen += 1
            if self.seen in self.drop:
                self.dropped.append(int.from_bytes(frames[1], "big"))
                continue
            if self.dropped and len(self._held) < self.hold:  # hold back what follows the gap
                self._held.append(frames)
                continue
            for held in self._held:
                self.pub.send_multipart(held)
            self._held = []
            self.pub.send_multipart(frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sub.close(linger=0)
        self.pub.close(linger=0)
        self.ctx.term()
