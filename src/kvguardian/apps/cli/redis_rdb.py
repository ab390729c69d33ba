"""``kv-guardian redis rdb FILE`` and ``redis scan --rdb URL``: the same analysis from an RDB snapshot.

A saved file (``dump.rdb``, a backup, ``redis-cli --rdb``'s output) or a snapshot streamed from a running
server through the replication handshake (`kvguardian.keyspace.rdb.snapshot`) is read without probing a
single key: the server spends no CPU per key. Output, JSON schema, verdicts and ``redis diff`` are those of
``redis scan``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvguardian.apps.cli.options import example
from kvguardian.core.errors import UsageError

if TYPE_CHECKING:
    from kvguardian.keyspace.result import ScanResult
    from kvguardian.keyspace.scan import ScanOptions

__all__ = ["ScanHooks", "add_rdb_command", "run_rdb", "run_scan_rdb"]


@dataclass(frozen=True)
class ScanHooks:
    """What ``redis scan`` shares with ``redis rdb`` (passed in, so this module does not import cli.redis)."""

    scan_arguments: Callable[[argparse.ArgumentParser], None]
    output_arguments: Callable[[argparse.ArgumentParser], None]
    verdict_arguments: Callable[[argparse.ArgumentParser], None]
    options: Callable[[argparse.Namespace], Any]  # argparse namespace -> ScanOptions
    emit: Callable[..., int]  # (args, result, old, command=...) -> exit code


def add_rdb_command(sub: Any, hooks: ScanHooks) -> None:
    rdb = sub.add_parser("rdb", help="analyze RDB snapshot files offline (no server involved)",
                         description="Read RDB files (Redis 5.0-8.x, RDB versions 9-12) and report key patterns, "
                                     "TTLs, idle times (under LRU/LFU policies) and leaks, as redis scan does. "
                                     "Several files (one per Cluster shard) are read in parallel processes into "
                                     "one report.",
                         epilog=example("kv-guardian redis rdb /var/lib/redis/dump.rdb --json -o today.json",
                                        "kv-guardian redis rdb shard1.rdb shard2.rdb shard3.rdb"))
    rdb.add_argument("file", metavar="FILE", nargs="+",
                     help="the RDB file (dump.rdb, a backup, redis-cli --rdb output); several: one per shard")
    hooks.scan_arguments(rdb)
    rdb.add_argument("--db", type=_database, default=None, help="only keys of this database (default: all)")
    hooks.output_arguments(rdb)
    hooks.verdict_arguments(rdb)
    rdb.set_defaults(redis_run=lambda args: run_rdb(args, hooks))


def _database(text: str) -> int:
    """``--db``: a database number, 0 to 2**31 - 1 (what a Redis server can be configured to have)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a database number; fix: e.g. --db 0") from None
    if not 0 <= n < 2**31:
        raise argparse.ArgumentTypeError(f"{text} is not a database number (0 or more); fix: e.g. --db 0")
    return n


def _progress_and_stop(args: argparse.Namespace) -> tuple[Any, threading.Event]:
    from kvguardian.keyspace.render import progress_bar

    return progress_bar(not args.no_progress and sys.stderr.isatty()), threading.Event()


def run_rdb(args: argparse.Namespace, hooks: ScanHooks) -> int:
    from kvguardian.keyspace.rdb.format import RdbError
    from kvguardian.keyspace.rdb.scan import RdbSource, scan_rdbs
    from kvguardian.keyspace.result import load_result

    opts = hooks.options(args)
    old = load_result(args.compare) if args.compare else None
    paths = [Path(p) for p in args.file]
    with contextlib.ExitStack() as opened:
        sources = []
        for path in paths:
            try:
                f = opened.enter_context(path.open("rb"))
            except OSError as exc:
                raise UsageError(f"cannot read RDB file {str(path)!r}: {exc.strerror or exc}") from None
            sources.append(RdbSource(f, str(path), total_bytes=path.stat().st_size if path.is_file() else 0))
        bar, stop = _progress_and_stop(args)
        with bar as progress:
            try:
                result = scan_rdbs(sources, opts, db=args.db, progress=progress, stop=stop)
            except RdbError as exc:  # a header: nothing was read yet
                named = f"RDB file {str(paths[0])!r}: " if len(paths) == 1 else "RDB files: "
                raise UsageError(f"{named}{exc}; fix: pass snapshots written by Redis 5.0 or later (dump.rdb, "
                                 "redis-cli --rdb FILE)") from None
    return hooks.emit(args, result, old, command="rdb")


def run_scan_rdb(args: argparse.Namespace, opts: ScanOptions, old: ScanResult | None, emit: Callable[..., int]) -> int:
    """``redis scan --rdb URL``: a snapshot through the replication handshake, read as it streams in."""
    from kvguardian.keyspace.connect import display_url, url_db
    from kvguardian.keyspace.rdb.scan import RdbSource, scan_rdb
    from kvguardian.keyspace.rdb.snapshot import open_snapshot

    where = display_url(args.url)
    db = url_db(args.url)  # a snapshot holds every database: keep the one the URL names, if it names one
    snap = open_snapshot(args.url, where, timeout=opts.timeout)
    bar, stop = _progress_and_stop(args)
    try:
        with bar as progress:
            result = scan_rdb(RdbSource(snap, where, limit=snap.length, total_bytes=snap.length or 0), opts,
                              db=db, progress=progress, stop=stop)
    finally:
        snap.close()
    how = "diskless" if snap.length is None else "from disk"
    result.mode_reason += f"; fetched through the replication handshake ({how})"
    return emit(args, result, old, command="scan")
