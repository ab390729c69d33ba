"""Subscribe to vLLM's KV events over ZMQ: both socket topologies, sequence tracking, gap repair through the
replay socket (KVG209), and a watch on whether any publisher is connected at all.

vLLM binds or connects depending on its endpoint string, so the watcher connects or binds (``--events-bind``)
to match; a socket monitor reports "no publisher" instead of silently reading nothing. Gaps are replayed from
vLLM's ROUTER socket or reported lost; a sequence going back means a restart and resets the index. Every poll
and wait is bounded. Topologies, rules and bounds: docs/design/engines.md.
"""

from __future__ import annotations

import bisect
import threading
import time
import urllib.parse
from collections import Counter
from typing import Any

from kvguardian.core.errors import UsageError, require
from kvguardian.core.findings import Finding, Severity
from kvguardian.runtime.engines.board import FindingBoard
from kvguardian.runtime.engines.kv_events import DecodeError, decode_batch, split_frames, split_replay_frames
from kvguardian.runtime.engines.prefix_audit import PrefixIndexAudit

__all__ = ["KVEventSubscriber", "check_endpoint", "resolve_endpoint"]

_DRAIN = 1_000  # messages handled per poll before returning to the caller's loop
_DRAIN_SECONDS = 0.2  # and at most this long receiving them
_MAX_REPLAYED = 20_000  # replayed batches kept per request (vLLM buffers 10,000 steps by default)
_REPLAY_BACKOFF = 5.0  # seconds a silent replay socket is left alone
_REPLAY_MAX_SECONDS = 60.0  # a replay that keeps answering is still cut off after this long
_SLICE = 0.1  # longest single wait, so that a stop request is seen promptly
_WILDCARDS = ("*", "0.0.0.0", "::", "[::]")


def check_endpoint(endpoint: str, flag: str) -> str:
    """Validate a ``tcp://HOST:PORT`` (or ``ipc://``/``inproc://``) endpoint; raises `UsageError`."""
    if endpoint.startswith(("ipc://", "inproc://")) and len(endpoint) > len("ipc://"):
        return endpoint
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not endpoint.startswith("tcp://") or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{flag} {endpoint!r} is not a ZMQ endpoint; fix: e.g. {flag} tcp://127.0.0.1:5557")
    return endpoint


def resolve_endpoint(endpoint: str, flag: str, *, bind: bool = False, server_host: str | None = None) -> str:
    """The endpoint the watcher's socket uses: vLLM's wildcard bind form ``tcp://*:P`` becomes a connection to
    ``server_host`` (the host of ``--metrics``); with ``bind`` the address must be concrete. Raises `UsageError`."""
    endpoint = check_endpoint(endpoint, flag)
    if not endpoint.startswith("tcp://"):
        if bind:
            raise UsageError(f"{flag} {endpoint!r}: vLLM binds ipc:// and inproc:// endpoints itself; fix: drop "
                             "--events-bind and connect to the same path")
        return endpoint
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    if host not in _WILDCARDS:
        return endpoint
    if bind:
        raise UsageError(f"{flag} {endpoint!r} binds every interface; fix: bind one address, e.g. "
                         f"tcp://127.0.0.1:{port} (vLLM's endpoint must then be that address)")
    target = server_host or "127.0.0.1"
    target = f"[{target}]" if ":" in target and not target.startswith("[") else target
    return f"tcp://{target}:{port}"


def metrics_host(url: str) -> str | None:
    """The host of a metrics URL (where a wildcard-bound publisher is reached)."""
    return urllib.parse.urlsplit(url).hostname


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
        bind: bool = False,
        server_host: str | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        zmq: Any = require("zmq", "zmq")
        require("msgpack", "zmq")
        self._zmq = zmq
        self.requested = endpoint
        self.bind = bind
        self.endpoint = resolve_endpoint(endpoint, "--events", bind=bind, server_host=server_host)
        self.replay_endpoint = (resolve_endpoint(replay, "--replay", server_host=server_host)
                                if replay else None)
        self.audit = audit
        self.board = board
        self.replay_timeout = replay_timeout
        self._stop = stop or threading.Event()
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 100_000)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._monitor = self._sub.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
        try:
            if bind:
                self._sub.bind(self.endpoint)
            else:
                self._sub.connect(self.endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise UsageError(f"--events {endpoint!r}: cannot {'bind' if bind else 'connect'} {self.endpoint} "
                             f"({exc}); fix: pick a free local address or drop --events-bind") from None
        self._dealer: Any = None
        self.last_seq: int | None = None
        self.batches = 0
        self.gaps = 0
        self.replayed = 0
        self.lost = 0
        self.errors: Counter[str] = Counter()
        self.history_complete: bool | None = None  # did the first replay reach back to sequence 0?
        self.last_ts: float | None = None
        self.last_batch_at: float | None = None  # monotonic time of the last applied batch
        self.peers = 0  # publishers connected now (connected to us, or we to them)
        self.ever_connected = False
        self.connect_retries = 0
        self._replay_quiet_until = 0.0
        self.deadline: float | None = None  # monotonic time after which no replay waits (the watch's end)

    def close(self) -> None:
        """Close the sockets (idempotent); counters stay readable."""
        if self._ctx.closed:
            return
        for sock in (self._monitor, self._sub, getattr(self, "_dealer", None)):
            if sock is not None:
                sock.close(linger=0)
        self._dealer = None
        self._ctx.term()

    # ------------------------------------------------------------------ connection state
    def _read_monitor(self) -> None:
        from zmq.utils.monitor import parse_monitor_message

        zmq = self._zmq
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))["event"]
            except zmq.Again:
                return
            except (zmq.ZMQError, ValueError, KeyError):
                return
            if event in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                self.peers += 1
                self.ever_connected = True
            elif event == zmq.EVENT_DISCONNECTED:
                self.peers = max(0, self.peers - 1)
            elif event == zmq.EVENT_CONNECT_RETRIED:
                self.connect_retries += 1

    # ------------------------------------------------------------------ live stream
    def poll(self, timeout: float) -> int:
        """Handle messages arriving within ``timeout`` seconds (a bounded batch of them); returns how many."""
        zmq = self._zmq
        self._read_monitor()
        deadline = time.monotonic() + max(timeout, 0.0)
        while not self._sub.poll(int(max(0.0, min(_SLICE, deadline - time.monotonic())) * 1000)):
            self._read_monitor()
            if self._stop.is_set() or time.monotonic() >= deadline:
                return 0
        received: list[list[bytes]] = []
        stop_at = time.monotonic() + _DRAIN_SECONDS
        while len(received) < _DRAIN and time.monotonic() < stop_at:
            try:
                received.append(self._sub.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        self.handle(received, time.monotonic())
        return len(received)

    def handle(self, received: list[list[bytes]], now: float) -> None:
        """Apply the messages of one poll in order (malformed ones counted); runs between publisher restarts
        are flushed one by one."""
        msgs: list[tuple[int, bytes]] = []
        for frames in received:
            try:
                msgs.append(split_frames(frames))
            except DecodeError as exc:
                self.errors[exc.reason] += 1
        run: list[tuple[int, bytes]] = []
        replay_allowed = True
        for seq, payload in msgs:
            prev = run[-1][0] if run else self.last_seq
            if prev is not None and seq <= prev:  # PUB/SUB never redelivers: a lower sequence is a new publisher
                replay_allowed = self._flush(run, now, replay_allowed)
                run = []
                self.audit.reset(now, restart=True)
                self.last_seq = None
            run.append((seq, payload))
        self._flush(run, now, replay_allowed)

    def _flush(self, run: list[tuple[int, bytes]], now: float, replay_allowed: bool) -> bool:
        """Apply a run of increasing sequences, replaying what is missing before it and between its messages
        with at most one replay request. Returns whether a replay is still allowed in this poll."""
        if not run:
            return replay_allowed
        history = self.last_seq is None
        cursor = 0 if history else self.last_seq + 1  # type: ignore[operator]
        holes = self._holes(cursor, run)
        if history and run[0][0] == 0:
            self.history_complete = True
        got: dict[int, bytes] = {}
        if holes and self.replay_endpoint is not None and replay_allowed and now >= self._replay_quiet_until:
            got = self._replay(holes[0][0], holes[-1][1], holes, now)
            replay_allowed = False
        for seq, payload in run:
            if seq > cursor:
                self._fill(cursor, seq, got, now, history=history)
            history = False
            self.last_seq = seq
            self._apply(payload, now)
            cursor = seq + 1
        return replay_allowed

    @staticmethod
    def _holes(cursor: int, run: list[tuple[int, bytes]]) -> list[tuple[int, int]]:
        holes = []
        for seq, _ in run:
            if seq > cursor:
                holes.append((cursor, seq))
            cursor = seq + 1
        return holes

    def _fill(self, first: int, stop: int, got: dict[int, bytes], now: float, *, history: bool) -> None:
        """Apply the replayed batches of ``first .. stop-1``; account for the rest (history or a gap)."""
        recovered = sorted(s for s in got if first <= s < stop)
        missing = stop - first
        if history and len(recovered) < missing:
            # A part of the history is worse than none: the blocks it stores would lack the removals of the
            # batches that did not come (a false KVG208 once a slow replay timed out under load). Without it
            # the index misses only blocks stored before we joined, whose removals it ignores as unknown.
            self.history_complete = False
            return
        for seq in recovered:
            self._apply(got[seq], now)
        self.replayed += len(recovered)
        if history:  # the stream before we subscribed: fetched once, never a gap
            self.history_complete = True
            return
        self.gaps += 1
        lost = missing - len(recovered)
        if lost > 0:
            self._lost(first, missing, len(recovered), lost, now)

    def _lost(self, first: int, missing: int, got: int, lost: int, now: float) -> None:
        self.lost += lost
        self.audit.mark_incomplete()
        if self.replay_endpoint is None:
            how = "no replay endpoint was given (--replay)"
            fix = "give the watcher vLLM's replay endpoint (--replay; kv-events-config replay_endpoint)"
        else:
            how = f"the replay socket returned {got} of them"
            fix = ("the publisher no longer buffered them or did not answer in time: raise vLLM's kv-events "
                   "buffer_steps, keep the watcher from falling behind, or raise the replay timeout")
        self.board.raise_(("KVG209", "prefix-index"), Finding(
            id="KVG209",
            severity=Severity.WARNING,
            message=(f"{missing} KV event batch(es) (sequences {first}..{first + missing - 1}) were missed and "
                     f"{how}; {self.lost} lost in total, so the prefix-index audit is incomplete until the next "
                     "clear"),
            evidence={"first_missing": first, "missing": missing, "recovered": got, "lost_total": self.lost,
                      "gaps_total": self.gaps, "replay_configured": self.replay_endpoint is not None},
            fix=fix,
        ), now)

    def _apply(self, payload: bytes, now: float) -> None:
        self.batches += 1
        self.last_batch_at = now
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
        self.audit.evaluate(now, batch_ts=batch.ts)

    # ------------------------------------------------------------------ replay
    def _replay(self, first: int, last_stop: int, holes: list[tuple[int, int]], now: float) -> dict[int, bytes]:
        """One replay request from ``first``; keeps the batches that fall in ``holes``, stops reading once
        ``last_stop - 1`` has come, after ``replay_timeout`` seconds without a reply (``_REPLAY_MAX_SECONDS`` in
        all, or the watch's end), or when asked to stop."""
        zmq = self._zmq
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            # vLLM's ROUTER drops replies past its send queue: let ours take a whole buffer while we read
            self._dealer.setsockopt(zmq.RCVHWM, _MAX_REPLAYED)
            self._dealer.connect(self.replay_endpoint)
        self._dealer.send_multipart([b"", first.to_bytes(8, "big")])
        got: dict[int, bytes] = {}
        starts = [a for a, _ in holes]
        # replay_timeout bounds the silence before each reply, not the whole replay: a long history from a
        # loaded server takes longer than that and is still coming (it timed out part-way, then was dropped)
        quiet_until = time.monotonic() + self.replay_timeout
        give_up = time.monotonic() + max(self.replay_timeout, _REPLAY_MAX_SECONDS)
        if self.deadline is not None:
            give_up = min(give_up, self.deadline)
        finished = answered = False
        replies = 0
        while not self._stop.is_set() and (left := min(quiet_until, give_up) - time.monotonic()) > 0:
            if not self._dealer.poll(int(min(left, _SLICE) * 1000) or 1):
                continue
            answered = True
            replies += 1
            if replies > _MAX_REPLAYED:
                break  # more than any buffer we keep: a publisher that does not stop
            quiet_until = time.monotonic() + self.replay_timeout
            try:
                seq, payload = split_replay_frames(self._dealer.recv_multipart())
            except DecodeError as exc:
                self.errors[exc.reason] += 1
                continue
            if seq == -1:
                finished = True
                break
            if len(got) < _MAX_REPLAYED and _in_holes(seq, holes, starts):
                got[seq] = payload
            if seq >= last_stop - 1:
                break  # everything missing has come; newer batches arrive live
        if not finished:  # unread replies would be taken as the answer to the next request: start afresh
            self._dealer.close(linger=0)
            self._dealer = None
        if not answered:
            self._replay_quiet_until = time.monotonic() + _REPLAY_BACKOFF
        return got


def _in_holes(seq: int, holes: list[tuple[int, int]], starts: list[int]) -> bool:
    i = bisect.bisect_right(starts, seq) - 1
    return i >= 0 and holes[i][0] <= seq < holes[i][1]
