"""``kv-guardian redis exporter``: /metrics with O(1) gauges on every scrape and the last completed scan.

A scrape runs ``INFO keyspace`` and ``INFO memory`` only (constant time at any key count) and reads the
last *completed* scan from memory. Scans run on their own thread and schedule (``interval`` seconds
between the end of one and the start of the next), never inside a scrape — the failure mode of exporters
that scan keys in the scrape and never finish at 10M keys. An incomplete scan (server lost) does not
replace the last completed one; its error is exported as a counter and logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from kvguardian.core.exporters.prometheus import family
from kvguardian.keyspace.connect import connect, display_url
from kvguardian.keyspace.metrics import info_families, scan_families
from kvguardian.keyspace.result import ScanResult
from kvguardian.keyspace.scan import IDLE_UNKNOWN, ScanOptions, scan

if TYPE_CHECKING:
    from kvguardian.core.exporters.webconfig import WebConfig

__all__ = ["Exporter"]

log = logging.getLogger("kvguardian.redis.exporter")


class Exporter:
    """Owns the scan thread, the last completed scan, and the collector; `serve` adds the HTTP server."""

    def __init__(self, url: str, options: ScanOptions | None = None, *, interval: float = 300.0, top: int = 50,
                 finalize: Callable[[ScanResult], ScanResult] | None = None) -> None:
        self.url = url
        self.options = options or ScanOptions()
        self.interval = interval
        self.top = top
        self.finalize = finalize  # callable(ScanResult) -> ScanResult: verdicts and redaction
        self.last: ScanResult | None = None  # replaced whole, never mutated: scrapes read it without a lock
        self.scans_total = 0
        self.scan_errors_total = 0
        self.scanning = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._info_client = connect(url, timeout=min(self.options.timeout, 5.0))
        self._server: Any = None

    # -- scans -------------------------------------------------------------------------------------------
    def scan_once(self) -> ScanResult:
        self.scanning = True
        try:
            result = scan(self.url, self.options, stop=self._stop)
        finally:
            self.scanning = False
        if self.finalize is not None:
            result = self.finalize(result)
        self.scans_total += 1
        if result.complete or result.incomplete_reason in ("sample", IDLE_UNKNOWN):  # every key was seen
            self.last = result
        else:
            self.scan_errors_total += 1
            log.warning("scan of %s incomplete: %s", display_url(self.url), result.incomplete_reason)
        return result

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan_once()
            except Exception as exc:  # a scan must not kill the exporter; the next one may work
                self.scan_errors_total += 1
                log.warning("scan of %s failed: %s", display_url(self.url), exc)
            self._stop.wait(self.interval)

    def start(self) -> None:
        """Start the scan thread (the first scan begins at once)."""
        self._thread = threading.Thread(target=self._loop, name="kvg-redis-scan", daemon=True)
        self._thread.start()

    # -- scrapes ------------------------------------------------------------------------------------------
    def collect(self) -> Iterator[Any]:
        t0 = time.perf_counter()
        info: dict[str, Any] = {}
        up = True
        try:
            info.update(self._info_client.info("keyspace"))
            info.update(self._info_client.info("memory"))
        except Exception as exc:  # the server is down: say so in the metrics, do not fail the scrape
            up = False
            log.debug("INFO failed: %s", exc)
        yield from info_families(info, up, time.perf_counter() - t0)
        yield from scan_families(self.last, top=self.top)
        for name, value in (
            ("kvguardian_redis_sweeps_total", self.scans_total),
            ("kvguardian_redis_sweep_errors_total", self.scan_errors_total),
            ("kvguardian_redis_sweep_running", int(self.scanning)),
        ):
            fam = family(name)
            fam.add_metric([], float(value))
            yield fam

    def serve(self, port: int, addr: str = "127.0.0.1", *, web_config: WebConfig | None = None) -> tuple[str, int]:
        """Serve /metrics on ``addr:port`` (127.0.0.1 unless told otherwise), with ``web_config``'s TLS and
        basic auth when given; returns the bound address.

        Raises:
            OSError: the address cannot be bound.
            UsageError: the web config's certificate cannot be loaded.
        """
        from prometheus_client import CollectorRegistry

        from kvguardian.core.exporters.http import MetricsHTTPServer

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]
        self._server = MetricsHTTPServer(registry, addr, port, web=web_config)
        host, bound = self._server.server_address[:2]
        return str(host), int(bound)

    def close(self) -> None:
        """Stop serving at once; a scan in flight sees the stop at its next batch (its thread is a daemon,
        so a server that hangs cannot hold the exit)."""
        self._stop.set()
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._info_client.close()
