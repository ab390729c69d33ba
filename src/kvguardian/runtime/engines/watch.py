"""The watch loop: scrape the server's metrics every ``interval`` seconds, read KV events in between, keep the
findings on a board, and produce a `Report` (terminal, JSON) and metrics (`watch_exporter`).

It never hangs (each scrape bounded, `stop` cuts an in-flight scrape or replay), and it reports silent
incompleteness (no publisher connected, or prompts answered while no event batch arrived) in
``summary["incomplete"]`` and ``summary["warnings"]``. Example: docs/design/engines.md.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import Any

from kvguardian.core.errors import UsageError, require
from kvguardian.core.findings import Finding, Report
from kvguardian.runtime.engines.board import FindingBoard
from kvguardian.runtime.engines.prefix_audit import PrefixIndexAudit
from kvguardian.runtime.engines.promtext import Scrape, ScrapeError, check_url, fetch, parse
from kvguardian.runtime.engines.sglang_metrics import SglangConservationCheck
from kvguardian.runtime.engines.vllm_metrics import VllmMetricsCheck

__all__ = ["ENGINES", "Watch", "replica_name"]

ENGINES = ("vllm", "sglang")


def replica_name(metrics_url: str) -> str:
    """``host:port`` of a metrics URL, without credentials or path: the name a fleet watch gives a replica in
    its findings and series (the address Prometheus would give the same target as ``instance``)."""
    parts = urllib.parse.urlsplit(metrics_url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def _model_name(engine: str, scrape: Scrape) -> str | None:
    """The ``model_name`` label of the engine's own series in a scrape (vLLM and SGLang both set it)."""
    for name, samples in scrape.items():
        if name.startswith(f"{engine}:"):
            for sample in samples:
                if sample.labels.get("model_name"):
                    return sample.labels["model_name"]
    return None


class Watch:
    """One watched server. Not thread-safe except `stop`, `report` and what the exporter reads."""

    def __init__(
        self,
        engine: str,
        metrics_url: str,
        *,
        events: str | None = None,
        replay: str | None = None,
        topic: str = "",
        interval: float = 5.0,
        grace: float = 60.0,
        timeout: float = 5.0,
        num_blocks: int | None = None,
        index_limit: int = 1_000_000,
        max_salts_per_prefix: int = 64,
        tolerance: int = 0,
        confirm: int = 2,
        replay_timeout: float = 2.0,
        events_bind: bool = False,
    ) -> None:
        if engine not in ENGINES:
            raise UsageError(f"unknown engine {engine!r}; use one of: {', '.join(ENGINES)}")
        if interval <= 0 or timeout <= 0:
            raise UsageError(f"--interval and --timeout must be > 0 seconds, got {interval!r} and {timeout!r}")
        if engine == "sglang" and (events or replay):
            raise UsageError("--events/--replay read vLLM's KV event stream; fix: drop them for sglang")
        if replay and not events:
            raise UsageError("--replay needs --events (replay repairs gaps in the event stream)")
        require("prometheus_client", "prometheus")  # its parser reads the metrics pages
        self.engine = engine
        self.metrics_url = check_url(metrics_url)
        self.replica = replica_name(self.metrics_url)
        self.model_name = ""  # the served model, from the engine's metrics (known after the first scrape)
        self.interval = interval
        self.timeout = timeout
        self.num_blocks = num_blocks
        self.board = FindingBoard()
        self.vllm = VllmMetricsCheck(self.board, grace=grace) if engine == "vllm" else None
        self.sglang = (SglangConservationCheck(self.board, grace=grace, tolerance=tolerance, confirm=confirm)
                       if engine == "sglang" else None)
        self.audit: PrefixIndexAudit | None = None
        self.subscriber: Any = None
        if events_bind and not events:
            raise UsageError("--events-bind needs --events (the address to bind)")
        self._stop = threading.Event()
        if events:
            from kvguardian.runtime.engines.kv_subscriber import KVEventSubscriber, metrics_host

            self.audit = PrefixIndexAudit(self.board, capacity_blocks=num_blocks, index_limit=index_limit,
                                          max_salts_per_prefix=max_salts_per_prefix, grace=grace)
            self.subscriber = KVEventSubscriber(events, self.audit, self.board, replay=replay, topic=topic,
                                                replay_timeout=replay_timeout, bind=events_bind,
                                                server_host=metrics_host(self.metrics_url), stop=self._stop)
        self.scrapes = 0
        self.scrape_errors: Counter[str] = Counter()
        self.last_scrape_error: str | None = None
        self.last_scrape_time: float | None = None  # unix time of the last successful scrape
        self.warnings: list[str] = []  # one line each: why the result may be incomplete
        self._warned: set[str] = set()
        self.on_warning: Callable[[str], None] | None = None  # called with each new warning line
        self._started = time.monotonic()
        self._end: float | None = None
        self._queries_base: tuple[float, float] | None = None  # (queries, hits) at the first scrape
        self._woke_queries: float | None = None  # prefix queries when the engine woke (the wake check)
        self.connect_grace = max(2 * interval, 2.0)  # how long a publisher may take to connect

    # ------------------------------------------------------------------ running
    def scrape_once(self, now: float | None = None) -> bool:
        """Scrape and check once. Returns False when the scrape failed (counted, not raised).

        Raises:
            UsageError: the page is not the engine's metrics (wrong URL or engine).
        """
        now = time.monotonic() if now is None else now
        timeout = self.timeout if self._end is None else max(0.05, min(self.timeout, self._end - now))
        try:
            scrape = parse(fetch(self.metrics_url, timeout=timeout, abort=self._stop))
        except ScrapeError as exc:
            self.scrape_errors[exc.reason] += 1
            self.last_scrape_error = str(exc)
            return False
        self.scrapes += 1
        self.last_scrape_time = time.time()
        self.model_name = _model_name(self.engine, scrape) or self.model_name
        if self.vllm is not None:
            self._observe_vllm(self.vllm, scrape, now)
        if self.sglang is not None:
            self.sglang.observe(scrape, now)
        self.check_events(now)
        return True

    def _observe_vllm(self, vllm: VllmMetricsCheck, scrape: Scrape, now: float) -> None:
        for kind, _key in vllm.observe(scrape, now):
            if self.audit is None:
                continue
            if kind == "sleep":
                self.audit.note_sleep(now, wall=self.last_scrape_time)
            else:
                self.audit.note_wake(now)
                self._woke_queries = vllm.prefix_queries
        if self._queries_base is None:
            self._queries_base = (vllm.prefix_queries, vllm.prefix_hits)
        if self.audit is not None:
            if self.num_blocks is None:
                self.audit.capacity_blocks = vllm.capacity_blocks()
            served = self._woke_queries is not None and vllm.prefix_queries > self._woke_queries
            self.audit.check_wake(now, engine_served=served)

    # ------------------------------------------------------------------ is the event stream reaching us?
    def check_events(self, now: float, *, ending: bool = False) -> None:
        """Warn (once each) when no publisher connected (within ``connect_grace``, or at all by the end of the
        watch), or prompts were served while no batch arrived."""
        sub = self.subscriber
        if sub is None:
            return
        if not sub.ever_connected and (ending or now - self._started >= self.connect_grace):
            if sub.bind:
                why = f"no KV-event publisher connected to {sub.endpoint} (bound by --events-bind)"
                fix = "set vLLM's kv-events-config endpoint to this address"
            else:
                why = f"nothing accepts connections at --events {sub.endpoint}"
                fix = ("check the address; vLLM binds only endpoints with '*' or '::' or ipc://, and connects to "
                       "tcp://HOST:PORT endpoints - then watch with --events tcp://HOST:PORT --events-bind")
            self.warn("no-publisher", f"{why} after {now - self._started:.1f} s; the KV-event audit sees "
                      f"nothing and is incomplete; fix: {fix}")
        if sub.batches or self.vllm is None or self._queries_base is None:
            return
        queries = self.vllm.prefix_queries - self._queries_base[0]
        computed = queries - (self.vllm.prefix_hits - self._queries_base[1])
        block = self.vllm.block_size() or 16
        if computed >= 4 * block:
            self.warn("silent-stream", (
                f"vllm:prefix_cache_queries_total grew by {queries:.0f} tokens ({computed:.0f} not served from "
                f"the cache, {block}-token blocks) yet no KV event batch arrived at {sub.endpoint}: vLLM's "
                "publisher is not reaching this watcher, so the KV-event audit is incomplete; fix: with vLLM "
                "endpoint tcp://*:PORT watch --events tcp://SERVER:PORT; with tcp://HOST:PORT add --events-bind; "
                "check --topic and that kv-events-config enables events"))

    def warn(self, key: str, line: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        self.warnings.append(line)
        if self.on_warning is not None:
            self.on_warning(line)

    def run(self, duration: float | None = None, on_new: Callable[[list[Finding]], None] | None = None) -> None:
        """Watch until ``duration`` seconds have passed (None: until `stop`)."""
        end = self._end = None if duration is None else time.monotonic() + duration
        if self.subscriber is not None:
            self.subscriber.deadline = end
        next_scrape = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if end is not None and now >= end:
                break
            if now >= next_scrape:
                self.scrape_once(now)
                next_scrape = max(next_scrape + self.interval, now)
            wait = next_scrape - time.monotonic()
            if end is not None:
                wait = min(wait, end - time.monotonic())
            wait = max(wait, 0.0)
            if self.subscriber is not None:
                self.subscriber.poll(min(wait, 0.25))
            else:
                self._stop.wait(min(wait, 0.25))
            if on_new is not None:
                new = self.board.take_new()
                if new:
                    on_new(new)

    def stop(self) -> None:
        """End `run` soon (within about 0.1 s): also cuts off an in-flight scrape or replay."""
        self._stop.set()

    def close(self) -> None:
        """Close the sockets; counters stay readable for `report`."""
        if self.subscriber is not None:
            self.subscriber.close()

    # ------------------------------------------------------------------ reading
    def idle_seconds(self) -> float:
        return self.vllm.idle_seconds(time.monotonic()) if self.vllm is not None else 0.0

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": self.engine,
            "metrics_url": self.metrics_url,
            "seconds_watched": round(time.monotonic() - self._started, 3),
            "scrapes": self.scrapes,
            "scrape_errors": dict(self.scrape_errors),
            "last_scrape_error": self.last_scrape_error,
            "findings_dropped": self.board.dropped,
            "incomplete": self.incomplete(),
            "warnings": list(self.warnings),
        }
        if self.vllm is not None:
            out["idle_kv_seconds"] = round(self.idle_seconds(), 3)
            out["cache_config"] = {",".join(f"{k}={v}" for k, v in key) or "-": vars(cfg)
                                   for key, cfg in self.vllm.cache_config.items()}
        if self.sglang is not None:
            out["sglang_unaccounted_tokens"] = self.sglang.max_unaccounted()
        sub = self.subscriber
        if self.audit is not None:
            out["kv_events"] = {
                **self.audit.summary(),
                "batches": sub.batches if sub else None,
                "gaps": sub.gaps if sub else None,
                "replayed": sub.replayed if sub else None,
                "lost": sub.lost if sub else None,
                "decode_errors": dict(sub.errors) if sub else None,
                "history_complete": sub.history_complete if sub else None,
                "endpoint": sub.endpoint if sub else None,
                "bound": sub.bind if sub else None,
                "publisher_connected": sub.ever_connected if sub else None,
                "connect_retries": sub.connect_retries if sub else None,
                "note": "allocation and free are silent in KV events; ref-count leaks show only in the metrics",
            }
        return out

    def incomplete(self) -> bool:
        """Whether the event audit missed something: lost batches, no publisher, or a silent stream."""
        if self.audit is None:
            return False
        return self.audit.incomplete or bool(self._warned & {"no-publisher", "silent-stream"})

    def report(self) -> Report:
        # a watch shorter than the connect grace (--duration 2, default --interval 5) still says that nothing
        # connected: it was "incomplete: false" with 0 batches
        self.check_events(time.monotonic(), ending=True)
        return Report(findings=self.board.all(), summary=self.summary())

    def summary_lines(self) -> list[str]:
        """The summary in a few plain lines for the terminal (the JSON report has it all)."""
        s = self.summary()
        errors = ", ".join(f"{k} {v}" for k, v in sorted(s["scrape_errors"].items())) or "none"
        lines = [f"watched {s['engine']} for {s['seconds_watched']:.1f} s: {s['scrapes']} scrape(s), "
                 f"scrape errors: {errors}"]
        if self.vllm is not None:
            lines.append(f"KV usage while idle: {s['idle_kv_seconds']:.1f} s (grace {self.vllm.grace:g} s)")
        ev = s.get("kv_events")
        if ev:
            decode = ", ".join(f"{k} {v}" for k, v in sorted(ev["decode_errors"].items())) or "none"
            lines.append(
                f"KV events: {ev['batches']} batch(es) ({ev['replayed']} replayed, {ev['gaps']} gap(s), "
                f"{ev['lost']} lost), decode errors: {decode}; index {ev['index_blocks']} block(s), "
                f"{ev['clears']} clear(s), {ev['blocks_reannounced']} re-announced"
                + ("; INCOMPLETE" if s["incomplete"] else ""))
        return lines
