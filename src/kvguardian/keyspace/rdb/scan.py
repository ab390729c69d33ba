"""An RDB snapshot → the `ScanResult` a live sweep gives: same pattern mining, statistics, JSON, verdicts, diff.

The result says how it differs from a live sweep: ``mode`` is ``"rdb"``, bytes are estimates counting every
element (`kvguardian.keyspace.rdb.size`), the idle metric is whatever the file carries, TTLs are relative to
the snapshot, and ``server.rdb.checksum`` records the CRC64 verdict. A damaged file ends the result early,
incomplete, keeping what was read. The differences one by one: docs/design/keyspace.md.
"""

from __future__ import annotations

import fnmatch
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvguardian.keyspace.patterns import PatternMiner
from kvguardian.keyspace.rdb.checksum import Verdict
from kvguardian.keyspace.rdb.format import VERSIONS, RdbError
from kvguardian.keyspace.rdb.parallel import ReaderProcess, worth_forking
from kvguardian.keyspace.rdb.reader import Batch, ByteStream, RdbReader
from kvguardian.keyspace.result import ScanResult
from kvguardian.keyspace.stats import PatternStats
from kvguardian.keyspace.sweep import SweepOptions, build_patterns, mine_and_count, warn_overflow

__all__ = ["RdbSource", "scan_rdb"]

Progress = Callable[[int, int], None]  # (bytes read, total bytes or 0)


class _Filter:
    """The ``--match`` glob and ``--db`` choice applied to a batch."""

    def __init__(self, match: str | None, db: int | None) -> None:
        self.rx = re.compile(fnmatch.translate(match).encode("latin-1"), re.S) if match else None
        self.db = db

    def apply(self, b: Batch) -> Batch:
        if self.db is not None and b.db != self.db:
            return Batch(db=b.db)
        if self.rx is None:
            return b
        keep = [i for i, k in enumerate(b.keys) if self.rx.match(k)]
        return _take(b, keep)


def _take(b: Batch, idx: list[int] | range) -> Batch:
    return Batch([b.keys[i] for i in idx], b.cols[np.asarray(idx, dtype=np.int64)], b.db)


def _probe(b: Batch, now_ms: int) -> np.ndarray:
    """The live probe's [N, 4] layout: type code, bytes, PTTL (-1 none, -2 expired by then), idle or freq."""
    probe = b.cols.copy()
    exp = b.expires
    pttl = np.where(exp >= 0, exp - now_ms, -1)
    pttl[(exp >= 0) & (pttl <= 0)] = -2
    probe[:, 2] = pttl
    return probe


_MAX_CTIME = 2**63 // 1000 - 1  # seconds whose milliseconds still fit the int64 columns


def aux_int(aux: dict[str, str], name: str, top: int) -> int | None:
    """An AUX field that Redis writes as a number (``ctime``, ``used-mem``), or None when the file carries
    something else there (a damaged or hand-made file): never an exception, never out of the columns' range."""
    text = aux.get(name, "").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 20 or int(text) > top:
        return None
    return int(text)


class _Run:
    """One pass over a file: stats are built when the first key says which idle metric the file carries."""

    def __init__(self, reader: RdbReader | ReaderProcess, opts: SweepOptions) -> None:
        self.reader, self.opts = reader, opts
        self.stats: PatternStats | None = None
        self.miner: PatternMiner | None = None
        self.done = 0
        self.per_db: Counter[int] = Counter()
        self.seen_dbs: set[int] = set()  # every database the file holds keys of, kept or not

    def metric(self) -> str:
        return "freq" if self.reader.saw_freq else "idletime"

    def cold(self) -> float:
        return float(self.opts.cold_freq) if self.metric() == "freq" else self.opts.cold_after

    def add(self, b: Batch, now_ms: int) -> None:
        if self.stats is None:
            self.stats = PatternStats(cold_after=int(self.cold()), idle_metric=self.metric())
            self.miner = PatternMiner(max_patterns=self.opts.max_patterns, collapse_after=self.opts.collapse_after,
                                      on_merge=self.stats.merge)
        assert self.miner is not None
        mine_and_count(self.miner, self.stats, b.keys, _probe(b, now_ms))
        self.done += len(b)
        self.per_db[b.db] += len(b)

    def read(self, result: ScanResult, keep: _Filter, *, progress: Progress | None, total: int,
             stop: threading.Event | None) -> None:
        reader, sample = self.reader, self.opts.sample
        now_ms = 0
        for batch in reader.batches():
            if not now_ms:  # AUX fields come before the first key
                now_ms = (aux_int(reader.aux, "ctime", _MAX_CTIME) or int(time.time())) * 1000
            if len(batch):
                self.seen_dbs.add(batch.db)
            b = keep.apply(batch)
            if sample is not None and self.done + len(b) >= sample:
                self.add(_take(b, range(sample - self.done)), now_ms)
                result.complete, result.incomplete_reason = False, "sample"
                return
            if len(b):
                self.add(b, now_ms)
            if progress is not None:
                progress(reader.offset, total)
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt


@dataclass
class RdbSource:
    """Where an RDB comes from: a binary stream, what reports call it, and (for a replication payload) how
    many bytes it holds; ``total_bytes`` (0: unknown) is for progress."""

    stream: ByteStream
    target: str
    limit: int | None = None
    total_bytes: int = 0
    parallel: bool = True  # read in a forked child while this process mines (kvguardian.keyspace.rdb.parallel)


def scan_rdb(source: RdbSource, options: SweepOptions | None = None, *, db: int | None = None,
             progress: Progress | None = None, stop: threading.Event | None = None) -> ScanResult:
    """Read the RDB of ``source`` into a `ScanResult` (``db``: only that database).

    Raises:
        RdbError: the stream is not an RDB at all (a damaged file after its header gives a partial result).
    """
    opts = options or SweepOptions()
    result = ScanResult(target=source.target, started=time.time(), mode="rdb")
    reader: RdbReader | ReaderProcess
    if source.parallel and worth_forking(source.stream):
        reader = ReaderProcess.open(source.stream, limit=source.limit)
    else:
        reader = RdbReader(source.stream, limit=source.limit)
        reader.header()
    run = _Run(reader, opts)
    try:
        run.read(result, _Filter(opts.match, db), progress=progress, total=source.total_bytes, stop=stop)
    except RdbError as exc:
        result.complete = False
        result.incomplete_reason = f"damaged or truncated RDB at byte {exc.offset}: {exc}"
    except KeyboardInterrupt:
        result.complete, result.incomplete_reason = False, "interrupted"
    _finish(result, reader, run, opts, db)
    return result


def _say_checksum(result: ScanResult, verdict: str) -> None:
    """The trailing CRC64 (`checksum.Verdict`) in the result: a mismatch makes it incomplete."""
    result.server["rdb"]["checksum"] = verdict
    if verdict == Verdict.MISMATCH and result.complete:
        result.complete = False
        result.incomplete_reason = ("damaged RDB: its CRC64 does not match its bytes, so keys, sizes or names may "
                                    "be wrong (redis-check-rdb FILE says where)")
    elif verdict == Verdict.UNCHECKED:
        result.warnings.append("the file's CRC64 was not checked (pip install anycrc, or kv-guardian[redis])")


def _finish(result: ScanResult, reader: RdbReader | ReaderProcess, run: _Run, opts: SweepOptions,
            db: int | None) -> None:
    aux = reader.aux
    result.finished = time.time()
    result.idle_metric = run.metric()
    result.cold_after = run.cold()
    result.keys_scanned = run.done
    result.dbsize = run.done
    writer = aux.get("redis-ver", "?")
    result.mode_reason = f"RDB version {reader.version} written by Redis {writer}: no server CPU per key"
    policy = ("an LFU policy (FREQ records)" if reader.saw_freq else "an LRU policy (IDLE records)"
              if reader.saw_idle else "no LRU/LFU policy (no idle records)")
    result.server = {
        "version": writer, "cluster": False, "maxmemory_policy": policy,
        "nodes": [{"addr": result.target, "role": "rdb", "dbsize": run.done, "uptime_s": None,
                   "keys_scanned": run.done}],
        "rdb": {"version": reader.version, "ctime": aux_int(aux, "ctime", _MAX_CTIME) or 0,
                "used_mem": aux_int(aux, "used-mem", 2**63 - 1) or 0, "bytes_read": reader.offset,
                "databases": {str(k): v for k, v in sorted(run.per_db.items())}, "db": db,
                "modules_skipped": reader.modules_skipped, "functions": reader.functions},
    }
    for name, top in (("ctime", _MAX_CTIME), ("used-mem", 2**63 - 1)):
        if name in aux and aux_int(aux, name, top) is None:
            result.warnings.append(f"the file's AUX field {name} is {aux[name][:40]!r}, not a number "
                                   f"in 0-{top}: ignored" + (" (TTLs are measured from now)" if name == "ctime"
                                                             else ""))
    _say_checksum(result, reader.checksum)
    if reader.version not in VERSIONS:
        result.warnings.append(f"RDB version {reader.version} is newer than the 9-12 this reader was tested on")
    if run.done and not (reader.saw_idle or reader.saw_freq):
        result.warnings.append("the file carries no idle times (maxmemory-policy was neither LRU nor LFU when it "
                               "was saved): no key can be called cold")
    if db is None and len(run.per_db) > 1:
        result.warnings.append(f"keys of {len(run.per_db)} databases are counted together; pick one with --db N "
                               "(redis rdb) or /N at the end of the URL (redis scan --rdb)")
    if db is not None and db not in run.seen_dbs and result.complete:
        held = ", ".join(str(k) for k in sorted(run.seen_dbs)) or "none (the file holds no keys)"
        result.warnings.append(f"the snapshot holds no keys of database {db}; its databases: {held}")
    if reader.modules_skipped:
        result.warnings.append(f"{reader.modules_skipped} module value(s) skipped; their bytes are the serialized size")
    if run.stats is not None and run.miner is not None:
        result.keys_vanished = run.stats.keys_vanished
        result.patterns = build_patterns(run.miner, run.stats)
        result.bytes = sum(p["bytes"] for p in result.patterns)
        warn_overflow(result, opts)
