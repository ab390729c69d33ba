"""The watch loop: scrape the server's metrics every ``interval`` seconds, read KV events in between, keep the
findings on a board, and produce a `Report` (terminal, JSON) and metrics (`watch_exporter`).

    watch = Watch("vllm", "http://127.0.0.1:8000/metrics", events="tcp://127.0.0.1:5557",
                  replay="tcp://127.0.0.1:5558", grace=60)
    watch.run(duration=600)
    report = watch.report()
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from kvguardian._errors import UsageError, require
from kvguardian.engines.board import FindingBoard
from kvguardian.engines.prefix_audit import PrefixIndexAudit
from kvguardian.engines.promtext import ScrapeError, check_url, fetch, parse
from kvguardian.engines.sglang_metrics import SglangConservationCheck
from kvguardian.engines.vllm_metrics import VllmMetricsCheck
from kvguardian.findings import Finding, Report

__all__ = ["ENGINES", "Watch"]

ENGINES = ("vllm", "sglang")


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
        self.interval = interval
        self.timeout = timeout
        self.num_blocks = num_blocks
        self.board = FindingBoard()
        self.vllm = VllmMetricsCheck(self.board, grace=grace) if engine == "vllm" else None
        self.sglang = (SglangConservationCheck(self.board, grace=grace, tolerance=tolerance, confirm=confirm)
                       if engine == "sglang" else None)
        self.audit: PrefixIndexAudit | None = None
        self.subscriber: Any = None
        if events:
            from kvguardian.engines.kv_subscriber import KVEventSubscriber

            self.audit = PrefixIndexAudit(self.board, capacity_blocks=num_blocks, index_limit=index_limit,
                                          max_salts_per_prefix=max_salts_per_prefix)
            self.subscriber = KVEventSubscriber(events, self.audit, self.board, replay=replay, topic=topic,
                                                replay_timeout=replay_timeout)
        self.scrapes = 0
        self.scrape_errors: Counter[str] = Counter()
        self.last_scrape_error: str | None = None
        self.last_scrape_time: float | None = None  # unix time of the last successful scrape
        self._started = time.monotonic()
        self._stop = threading.Event()

    # ------------------------------------------------------------------ running
    def scrape_once(self, now: float | None = None) -> bool:
        """Scrape and check once. Returns False when the scrape failed (counted, not raised).

        Raises:
            UsageError: the page is not the engine's metrics (wrong URL or engine).
        """
        now = time.monotonic() if now is None else now
        try:
            scrape = parse(fetch(self.metrics_url, timeout=self.timeout))
        except ScrapeError as exc:
            self.scrape_errors[exc.reason] += 1
            self.last_scrape_error = str(exc)
            return False
        self.scrapes += 1
        self.last_scrape_time = time.time()
        if self.vllm is not None:
            for kind, _key in self.vllm.observe(scrape, now):
                if self.audit is not None:
                    (self.audit.note_sleep if kind == "sleep" else self.audit.note_wake)(now)
            if self.audit is not None and self.num_blocks is None:
                self.audit.capacity_blocks = self.vllm.capacity_blocks()
        if self.sglang is not None:
            self.sglang.observe(scrape, now)
        return True

    def run(self, duration: float | None = None, on_new: Callable[[list[Finding]], None] | None = None) -> None:
        """Watch until ``duration`` seconds have passed (None: until `stop`)."""
        end = None if duration is None else time.monotonic() + duration
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
                "note": "allocation and free are silent in KV events; ref-count leaks show only in the metrics",
            }
        return out

    def report(self) -> Report:
        return Report(findings=self.board.all(), summary=self.summary())
