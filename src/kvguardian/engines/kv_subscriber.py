"""Subscribe to vLLM's KV events over ZMQ: sequence tracking, gap repair through the replay socket (KVG209).

Live stream: a SUB socket connected to the publisher (vLLM default ``tcp://*:5557``), subscribed to the topic
(vLLM's default topic is empty). Each message is ``(topic, 8-byte big-endian sequence, msgpack batch)``;
sequences count up from 0 per publisher.

Replay: vLLM binds a ROUTER socket (e.g. ``tcp://*:5558``) that answers a request ``[identity, b"", start]``
(start: 8 bytes big-endian) with every buffered batch ``seq >= start`` as ``[identity, b"", seq, payload]``,
then an end marker with sequence -1 and an empty payload. We talk to it through a DEALER socket and send the
empty delimiter frame ourselves: a REQ socket (as in vLLM's example) accepts only the first reply of a stream.

Rules: ``seq == last + 1`` is applied; ``seq > last + 1`` is a gap: batches ``last+1 .. seq-1`` are replayed
(if a replay endpoint is given) and the ones that do not come back are lost (KVG209, the index is marked
incomplete until the next clear); ``seq <= last`` on the live stream means the publisher restarted (ZMQ
PUB/SUB never redelivers): the engine's cache started empty, so the index is reset. The first message after
subscribing may start anywhere: with a replay endpoint the buffered history before it is fetched once.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from kvguardian._errors import UsageError, require
from kvguardian.engines.board import FindingBoard
from kvguardian.engines.kv_events import DecodeError, decode_batch, decode_sequence, split_frames
from kvguardian.engines.prefix_audit import PrefixIndexAudit
from kvguardian.findings import Finding, Severity

__all__ = ["KVEventSubscriber", "check_endpoint"]

_DRAIN = 1_000  # messages handled per poll before returning to the caller's loop


def check_endpoint(endpoint: str, flag: str) -> str:
    """Validate a ``tcp://HOST:PORT`` (or ``ipc://``/``inproc://``) endpoint; raises `UsageError`."""
    if endpoint.startswith(("ipc://", "inproc://")) and len(endpoint) > len("ipc://"):
        return endpoint
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not endpoint.startswith("tcp://") or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{flag} {endpoint!r} is not a ZMQ endpoint; fix: e.g. {flag} tcp://127.0.0.1:5557")
    if host == "*":
        raise UsageError(f"{flag} {endpoint!r} is a bind address; fix: connect to the server, e.g. tcp://HOST:PORT")
    return endpoint


class KVEventSubscriber:
    """Receives batches, repairs gaps, and feeds the audit. Call `poll` from one thread; `close` at the end."""

    def __init__(
        self,
        endpoint: str,
        audit: PrefixIndexAudit,
        board: FindingBoard,
        *,
        replay: str | None = None,
        topic: str = "",
        replay_timeout: float = 2.0,
    ) -> None:
        zmq: Any = require("zmq", "zmq")
        require("msgpack", "zmq")
        self._zmq = zmq
        self.endpoint = check_endpoint(endpoint, "--events")
        self.replay_endpoint = check_endpoint(replay, "--replay") if replay else None
        self.audit = audit
        self.board = board
        self.replay_timeout = replay_timeout
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 100_000)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(self.endpoint)
        self._dealer: Any = None
        self.last_seq: int | None = None
        self.batches = 0
        self.gaps = 0
        self.replayed = 0
        self.lost = 0
        self.errors: Counter[str] = Counter()
        self.history_complete: bool | None = None  # did the first replay reach back to sequence 0?
        self.last_ts: float | None = None

    def close(self) -> None:
        """Close the sockets (idempotent); counters stay readable."""
        if self._ctx.closed:
            return
        for sock in (self._sub, self._dealer):
            if sock is not None:
                sock.close(linger=0)
        self._dealer = None
        self._ctx.term()

    # ------------------------------------------------------------------ live stream
    def poll(self, timeout: float) -> int:
        """Handle messages arriving within ``timeout`` seconds (at most a bounded batch); returns how many."""
        zmq = self._zmq
        if not self._sub.poll(int(max(timeout, 0) * 1000)):
            return 0
        handled = 0
        while handled < _DRAIN:
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            handled += 1
            self._handle(frames, time.monotonic())
        return handled

    def _handle(self, frames: list[bytes], now: float) -> None:
        try:
            seq, payload = split_frames(frames)
        except DecodeError as exc:
            self.errors[exc.reason] += 1
            return
        if self.last_seq is not None and seq <= self.last_seq:
            self.audit.reset(now, restart=True)  # PUB/SUB never redelivers: a lower sequence is a new publisher
            self.last_seq = None
        if self.last_seq is None:
            if seq > 0 and self.replay_endpoint is not None:
                got = self._replay(0, seq, now)
                self.history_complete = got == seq
            else:
                self.history_complete = seq == 0
        elif seq > self.last_seq + 1:
            self._gap(self.last_seq + 1, seq, now)
        self.last_seq = seq
        self._apply(payload, now)

    def _apply(self, payload: bytes, now: float) -> None:
        self.batches += 1
        try:
            batch = decode_batch(payload)
        except DecodeError as exc:
            self.errors[exc.reason] += 1
            self.audit.mark_incomplete()  # its events are lost to us
            return
        self.last_ts = batch.ts
        for ev in batch.events:
            if isinstance(ev, DecodeError):
                self.errors[ev.reason] += 1
                if ev.reason != "unknown_type":
                    self.audit.mark_incomplete()
            else:
                self.audit.apply(ev, now)
        self.audit.evaluate(now)

    # ------------------------------------------------------------------ gaps and replay
    def _gap(self, first: int, stop: int, now: float) -> None:
        self.gaps += 1
        missing = stop - first
        got = self._replay(first, stop, now) if self.replay_endpoint is not None else 0
        lost = missing - got
        if lost <= 0:
            return
        self.lost += lost
        self.audit.mark_incomplete()
        how = (f"the replay socket returned {got} of them" if self.replay_endpoint
               else "no replay endpoint was given (--replay)")
        self.board.raise_(("KVG209", "prefix-index"), Finding(
            id="KVG209",
            severity=Severity.WARNING,
            message=(f"{missing} KV event batch(es) (sequences {first}..{stop - 1}) were missed and {how}; "
                     f"{self.lost} lost in total, so the prefix-index audit is incomplete until the next clear"),
            evidence={"first_missing": first, "missing": missing, "recovered": got, "lost_total": self.lost,
                      "gaps_total": self.gaps, "replay_configured": self.replay_endpoint is not None},
        ), now)

    def _replay(self, first: int, stop: int, now: float) -> int:
        """Fetch batches ``first .. stop-1`` from the replay socket, apply them in order; returns how many."""
        zmq = self._zmq
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.connect(self.replay_endpoint)
        self._dealer.send_multipart([b"", first.to_bytes(8, "big")])
        got: dict[int, bytes] = {}
        deadline = time.monotonic() + self.replay_timeout
        finished = False
        while (left := deadline - time.monotonic()) > 0 and self._dealer.poll(int(left * 1000)):
            frames = self._dealer.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]  # the delimiter a ROUTER puts before the reply
            if len(frames) != 2:
                self.errors["frames"] += 1
                continue
            try:
                seq = decode_sequence(frames[0])
            except DecodeError as exc:
                self.errors[exc.reason] += 1
                continue
            if seq == -1 or not frames[1]:
                finished = True
                break
            if first <= seq < stop:
                got[seq] = frames[1]
        if not finished:  # late replies would be read as the answer to the next request: start afresh
            self._dealer.close(linger=0)
            self._dealer = None
        for seq in sorted(got):
            self._apply(got[seq], now)
        self.replayed += len(got)
        return len(got)
