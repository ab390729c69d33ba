"""The output of a scan and of a diff, through a `Reporter` (tables, warnings, findings, the JSON result);
a progress bar with keys/s and an ETA."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvguardian.core.findings import Report
from kvguardian.core.report.console import console
from kvguardian.core.report.reporter import Reporter
from kvguardian.keyspace.result import ScanResult
from kvguardian.keyspace.verdicts import human_bytes, human_seconds

__all__ = ["print_diff", "print_scan", "progress_bar"]


def _ttl_text(ttl: dict[str, int]) -> str:
    parts = [f"{k.replace('lt_', '<').replace('ge_', '≥')}:{v}" for k, v in ttl.items() if v]
    return " ".join(parts) or "—"


def print_scan(result: ScanResult, out: Reporter, *, top: int = 20) -> None:
    """The header line, the pattern table, warnings and findings of one scan."""
    state = "complete" if result.complete else f"INCOMPLETE ({result.incomplete_reason})"
    nodes = result.server.get("nodes") or []
    out.text(
        f"{result.target}: {result.keys_scanned} of {result.dbsize} keys on {len(nodes)} node(s) in "
        f"{result.duration_s:.1f} s ({result.keys_per_s:,.0f} keys/s, {result.mode}), {human_bytes(result.bytes)}, "
        f"{result.keys_vanished} vanished mid-scan — {state}")
    idle_key = "idle_s" if result.idle_metric == "idletime" else "lfu_freq"
    rows = []
    for p in result.patterns[:top]:
        i = p.get(idle_key) or {}
        idle = (f"{human_seconds(i.get('p50'))}/{human_seconds(i.get('p90'))}/{human_seconds(i.get('max'))}"
                if idle_key == "idle_s" else f"{i.get('p50')}/{i.get('p90')}/{i.get('max')}")
        rows.append([
            p["pattern"], f"{p['keys']:,}", human_bytes(p["bytes"]),
            f"{human_bytes(p['bytes_p50'])} / {human_bytes(p['bytes_max'])}",
            f"{p['no_ttl_keys']:,} ({human_bytes(p['no_ttl_bytes'])})",
            f"{p['cold_keys']:,} ({human_bytes(p['cold_bytes'])})", idle, _ttl_text(p["ttl"]),
            " ".join(f"{k}:{v}" for k, v in p["types"].items()),
        ])
    out.table(
        f"key patterns by memory (top {min(top, len(result.patterns))} of {len(result.patterns)})",
        ["pattern", "keys", "bytes", "p50 / max", "no TTL", "cold", "idle p50/p90/max" if idle_key == "idle_s"
         else "LFU p50/p90/max", "TTL", "types"],
        rows)
    if len(nodes) > 1:
        _print_shards(nodes, out)
    for w in result.warnings:
        out.text(f"warning: {w}", tone="warning")
    out.findings(Report(findings=list(result.findings)))


def _print_shards(nodes: list[dict[str, Any]], out: Reporter) -> None:
    """One row per Cluster shard scanned (or RDB file read): its keys and bytes, and why it stopped early."""
    out.table("per shard" if nodes[0].get("role") != "rdb" else "per file",
              ["node" if nodes[0].get("role") != "rdb" else "file", "role", "keys", "bytes", "stopped early"],
              [[str(n.get("addr")), str(n.get("role")), f"{n.get('keys_scanned') or 0:,}",
                human_bytes(n.get("bytes")), n.get("error") or "—"] for n in nodes])


def print_diff(rows: list[dict[str, Any]], report: Report, warnings: list[str], out: Reporter, *,
               top: int = 20) -> None:
    """The growth table, warnings and findings of a diff."""
    shown = sorted(rows, key=lambda r: -abs(r["bytes_delta"]))[:top]
    out.table(
        "key-space growth per pattern",
        ["pattern", "keys old → new", "Δ keys", "keys/h", "bytes old → new", "bytes/h", "coll. bytes/key"],
        [[r["pattern"] + (" (new)" if r["new_pattern"] else ""), f"{r['keys_old']:,} → {r['keys_new']:,}",
          f"{r['keys_delta']:+,}", f"{r['keys_per_hour']:+,.0f}",
          f"{human_bytes(r['bytes_old'])} → {human_bytes(r['bytes_new'])}", human_bytes(r["bytes_per_hour"]),
          f"{human_bytes(r['collection_bytes_per_key_old'])} → {human_bytes(r['collection_bytes_per_key_new'])}"]
         for r in shown])
    for w in warnings:
        out.text(f"warning: {w}", tone="warning")
    out.findings(report)


@contextmanager
def progress_bar(enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr (keys, keys/s, ETA from DBSIZE); yields the scan's progress callback."""
    if not enabled:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
               TextColumn("{task.fields[rate]} keys/s"), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn())
    with Progress(*columns, console=console(stderr=True), transient=True) as prog:
        task = prog.add_task("scan", total=None, rate="—")

        def update(done: int, total: int) -> None:
            speed = prog.tasks[0].speed
            prog.update(task, completed=done, total=max(total, done) or None,
                        rate=f"{speed:,.0f}" if speed else "—")

        yield update
