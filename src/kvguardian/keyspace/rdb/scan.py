"""An RDB snapshot → the `ScanResult` a live scan gives: same pattern mining, statistics, JSON, verdicts, diff.

The result says how it differs from a live scan: ``mode`` is ``"rdb"``, bytes are estimates counting every
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
from typing import Any

import numpy as np

from kvguardian.keyspace.patterns import PatternMiner
from kvguardian.keyspace.rdb.checksum import Verdict
from kvguardian.keyspace.rdb.format import VERSIONS, RdbError
from kvguardian.keyspace.rdb.parallel import ReaderProcess, worth_forking
from kvguardian.keyspace.rdb.reader import Batch, ByteStream, RdbReader
from kvguardian.keyspace.result import ScanResult
from kvguardian.keyspace.scan import ScanOptions, build_patterns, mine_and_count, warn_overflow
from kvguardian.keyspace.stats import PatternStats

__all__ = ["RdbSource", "scan_rdb", "scan_rdbs"]

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


class _File:
    """One snapshot being read: its reader, its batches and what it gave (keys, bytes, why it ended early)."""

    def __init__(self, reader: RdbReader | ReaderProcess, target: str) -> None:
        self.reader, self.target = reader, target
        self.batches = iter(reader.batches())  # a ReaderProcess forks its child at the first batch
        self.now_ms = 0  # the snapshot's ctime (ms): TTLs are relative to it
        self.keys = 0
        self.bytes = 0
        self.error: str | None = None
        self.per_db: Counter[int] = Counter()

    def close(self) -> None:
        """End the reader (a child still running after a sample or a stop is ended by its handle)."""
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()

    def next_batch(self) -> Batch | None:
        """The next batch, None at the end; `RdbError` for a damaged file."""
        batch = next(self.batches, None)
        if batch is not None and not self.now_ms:  # AUX fields come before the first key
            self.now_ms = (aux_int(self.reader.aux, "ctime", _MAX_CTIME) or int(time.time())) * 1000
        return batch


class _Run:
    """One pass over one or more files, their batches taken in turn so that every reader child works at once;
    one miner and one set of statistics for all, built when the first key says which idle metric the files
    carry (one miner sees every key: a pattern spread over per-shard dumps is one pattern)."""

    def __init__(self, files: list[_File], opts: ScanOptions) -> None:
        self.files, self.opts = files, opts
        self.stats: PatternStats | None = None
        self.miner: PatternMiner | None = None
        self.done = 0
        self.per_db: Counter[int] = Counter()
        self.seen_dbs: set[int] = set()  # every database the files hold keys of, kept or not

    def metric(self) -> str:
        return "freq" if any(f.reader.saw_freq for f in self.files) else "idletime"

    def cold(self) -> float:
        return float(self.opts.cold_freq) if self.metric() == "freq" else self.opts.cold_after

    def add(self, f: _File, b: Batch) -> None:
        if self.stats is None:
            self.stats = PatternStats(cold_after=int(self.cold()), idle_metric=self.metric())
            self.miner = PatternMiner(max_patterns=self.opts.max_patterns, collapse_after=self.opts.collapse_after,
                                      on_merge=self.stats.merge)
        assert self.miner is not None
        mine_and_count(self.miner, self.stats, b.keys, _probe(b, f.now_ms))
        self.done += len(b)
        self.per_db[b.db] += len(b)
        f.keys += len(b)
        f.per_db[b.db] += len(b)
        f.bytes += int(np.clip(b.sizes, 0, None).sum())

    def read(self, result: ScanResult, keep: _Filter, *, progress: Progress | None, total: int,
             stop: threading.Event | None) -> None:
        """Batches of every file in turn until all end; a damaged file ends alone (`RdbError` when it is the
        only one, so the single-file result reads as before)."""
        active = list(self.files)
        while active:
            for f in list(active):
                try:
                    batch = f.next_batch()
                except RdbError as exc:
                    if len(self.files) == 1:
                        raise
                    f.error = f"damaged or truncated RDB {f.target} at byte {exc.offset}: {exc}"
                    active.remove(f)
                    continue
                if batch is None:
                    active.remove(f)
                elif self._add_batch(f, batch, result, keep):
                    return
                if progress is not None:
                    progress(sum(g.reader.offset for g in self.files), total)
                if stop is not None and stop.is_set():
                    raise KeyboardInterrupt

    def _add_batch(self, f: _File, batch: Batch, result: ScanResult, keep: _Filter) -> bool:
        """Count one batch; True when ``--sample`` is reached."""
        if len(batch):
            self.seen_dbs.add(batch.db)
        b = keep.apply(batch)
        sample = self.opts.sample
        if sample is not None and self.done + len(b) >= sample:
            self.add(f, _take(b, range(sample - self.done)))
            result.complete, result.incomplete_reason = False, "sample"
            return True
        if len(b):
            self.add(f, b)
        return False


@dataclass
class RdbSource:
    """Where an RDB comes from: a binary stream, what reports call it, and (for a replication payload) how
    many bytes it holds; ``total_bytes`` (0: unknown) is for progress."""

    stream: ByteStream
    target: str
    limit: int | None = None
    total_bytes: int = 0
    parallel: bool = True  # read in a forked child while this process mines (kvguardian.keyspace.rdb.parallel)


def scan_rdb(source: RdbSource, options: ScanOptions | None = None, *, db: int | None = None,
             progress: Progress | None = None, stop: threading.Event | None = None) -> ScanResult:
    """Read the RDB of ``source`` into a `ScanResult` (``db``: only that database).

    Raises:
        RdbError: the stream is not an RDB at all (a damaged file after its header gives a partial result).
    """
    return scan_rdbs([source], options, db=db, progress=progress, stop=stop)


def scan_rdbs(sources: list[RdbSource], options: ScanOptions | None = None, *, db: int | None = None,
              progress: Progress | None = None, stop: threading.Event | None = None) -> ScanResult:
    """Read several RDBs (one per Cluster shard, say) into one `ScanResult`, each read by a child process of
    its own while this process mines them all; ``server.nodes`` has one row per file.

    Raises:
        RdbError: a stream is not an RDB at all, naming it when there are several (a damaged file after its
            header ends alone, and the result is partial).
    """
    opts = options or ScanOptions()
    target = sources[0].target if len(sources) == 1 else ", ".join(s.target for s in sources)
    result = ScanResult(target=target, started=time.time(), mode="rdb")
    files = [_File(_open(s, named=len(sources) > 1), s.target) for s in sources]
    run = _Run(files, opts)
    try:
        run.read(result, _Filter(opts.match, db), progress=progress, total=sum(s.total_bytes for s in sources),
                 stop=stop)
    except RdbError as exc:
        result.complete = False
        result.incomplete_reason = f"damaged or truncated RDB at byte {exc.offset}: {exc}"
    except KeyboardInterrupt:
        result.complete, result.incomplete_reason = False, "interrupted"
    finally:
        for f in files:
            f.close()
    _finish(result, run, opts, db)
    return result


def _open(source: RdbSource, *, named: bool) -> RdbReader | ReaderProcess:
    """A reader past the file's header: in a forked child where that helps (`rdb.parallel`)."""
    try:
        if source.parallel and worth_forking(source.stream):
            return ReaderProcess.open(source.stream, limit=source.limit)
        reader = RdbReader(source.stream, limit=source.limit)
        reader.header()
        return reader
    except RdbError as exc:
        if not named:
            raise
        raise RdbError(f"{source.target}: {exc}", exc.offset) from None


_WORST_FIRST = (Verdict.MISMATCH, Verdict.UNREAD, Verdict.UNCHECKED, Verdict.NONE, Verdict.OK)


def _file_facts(f: _File, db: int | None) -> tuple[dict[str, Any], list[str]]:
    """``server.rdb`` of one file, and the warnings about that file alone."""
    reader, aux = f.reader, f.reader.aux
    facts = {"version": reader.version, "ctime": aux_int(aux, "ctime", _MAX_CTIME) or 0,
             "used_mem": aux_int(aux, "used-mem", 2**63 - 1) or 0, "bytes_read": reader.offset,
             "databases": {str(k): v for k, v in sorted(f.per_db.items())}, "db": db,
             "modules_skipped": reader.modules_skipped, "functions": reader.functions, "checksum": reader.checksum}
    warnings = []
    for name, top in (("ctime", _MAX_CTIME), ("used-mem", 2**63 - 1)):
        if name in aux and aux_int(aux, name, top) is None:
            warnings.append(f"the file's AUX field {name} is {aux[name][:40]!r}, not a number in 0-{top}: ignored"
                            + (" (TTLs are measured from now)" if name == "ctime" else ""))
    if reader.checksum == Verdict.UNCHECKED:
        warnings.append("the file's CRC64 was not checked (pip install anycrc, or kv-guardian[redis])")
    if reader.version not in VERSIONS:
        warnings.append(f"RDB version {reader.version} is newer than the 9-12 this reader was tested on")
    if f.keys and not (reader.saw_idle or reader.saw_freq):
        warnings.append("the file carries no idle times (maxmemory-policy was neither LRU nor LFU when it "
                        "was saved): no key can be called cold")
    if reader.modules_skipped:
        warnings.append(f"{reader.modules_skipped} module value(s) skipped; their bytes are the serialized size")
    return facts, warnings


def _merged_facts(files: list[dict[str, Any]], targets: list[str]) -> dict[str, Any]:
    """``server.rdb`` of several files: sums, the newest version, the oldest ctime, the worst checksum
    verdict, and each file's own facts under ``files``."""
    databases: Counter[str] = Counter()
    for facts in files:
        databases.update(facts["databases"])
    return {"version": max(f["version"] for f in files), "ctime": min(f["ctime"] for f in files),
            **{k: sum(f[k] for f in files) for k in ("used_mem", "bytes_read", "modules_skipped", "functions")},
            "databases": dict(sorted(databases.items())), "db": files[0]["db"],
            "checksum": min((f["checksum"] for f in files), key=_WORST_FIRST.index),
            "files": [{"file": t, **f} for t, f in zip(targets, files)]}


def _policy(readers: list[RdbReader | ReaderProcess]) -> str:
    return ("an LFU policy (FREQ records)" if any(r.saw_freq for r in readers) else "an LRU policy (IDLE records)"
            if any(r.saw_idle for r in readers) else "no LRU/LFU policy (no idle records)")


def _finish(result: ScanResult, run: _Run, opts: ScanOptions, db: int | None) -> None:
    """The result's server facts, warnings and patterns, once every file is read."""
    files, many = run.files, len(run.files) > 1
    result.finished = time.time()
    result.idle_metric = run.metric()
    result.cold_after = run.cold()
    result.keys_scanned = result.dbsize = run.done
    writers = sorted({f.reader.aux.get("redis-ver", "?") for f in files})
    versions = sorted({f.reader.version for f in files})
    result.mode_reason = (f"RDB version {'/'.join(map(str, versions))} written by Redis {', '.join(writers)}: no "
                          "server CPU per key" + (f"; {len(files)} files read by {len(files)} processes" if many
                                                  else ""))
    per_file = [_file_facts(f, db) for f in files]
    result.server = {
        "version": ", ".join(writers), "cluster": False, "maxmemory_policy": _policy([f.reader for f in files]),
        "nodes": [{"addr": f.target, "role": "rdb", "dbsize": f.keys, "uptime_s": None, "keys_scanned": f.keys,
                   "bytes": f.bytes, "error": f.error} for f in files],
        "rdb": _merged_facts([p[0] for p in per_file], [f.target for f in files]) if many else per_file[0][0],
    }
    for f, (_, warnings) in zip(files, per_file):
        result.warnings.extend(f"{f.target}: {w}" if many else w for w in warnings)
    _say_ending(result, files, [p[0]["checksum"] for p in per_file])
    if db is None and len(run.per_db) > 1:
        result.warnings.append(f"keys of {len(run.per_db)} databases are counted together; pick one with --db N "
                               "(redis rdb) or /N at the end of the URL (redis scan --rdb)")
    if db is not None and db not in run.seen_dbs and result.complete:
        held = ", ".join(str(k) for k in sorted(run.seen_dbs)) or "none (the file holds no keys)"
        result.warnings.append(f"the snapshot holds no keys of database {db}; its databases: {held}")
    if run.stats is not None and run.miner is not None:
        result.keys_vanished = run.stats.keys_vanished
        result.patterns = build_patterns(run.miner, run.stats)
        result.bytes = sum(p["bytes"] for p in result.patterns)
        warn_overflow(result, opts)


def _say_ending(result: ScanResult, files: list[_File], verdicts: list[str]) -> None:
    """A damaged file (read only in part, or its CRC64 not matching its bytes) makes the result incomplete:
    one line naming the first, the others in the warnings."""
    bad = [f.error for f in files if f.error]
    bad += [f"damaged RDB{' ' + f.target if len(files) > 1 else ''}: its CRC64 does not match its bytes, so keys, "
            "sizes or names may be wrong (redis-check-rdb FILE says where)"
            for f, v in zip(files, verdicts) if v == Verdict.MISMATCH]
    if bad and result.complete:
        result.complete = False
        rest = len(files) - sum(1 for f in files if f.error)
        result.incomplete_reason = bad[0] + (f"; the keys of the other {rest} files are counted" if len(files) > 1
                                             else "")
    result.warnings.extend(bad[1:] if len(bad) > 1 else [])
