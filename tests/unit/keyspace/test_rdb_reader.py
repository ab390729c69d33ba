"""The RDB reader on hand-built files: what Redis 7.0 here cannot write (RDB 12 hash field TTLs, module values and
module AUX, functions, slot info), length and string encodings, LZF; the size classes; the batch sizer."""

from __future__ import annotations

import io
import struct

import pytest
from kvg_rdb_files import ln, rdb, st, st_aux

from kvguardian.keyspace.pacing import BatchSizer
from kvguardian.keyspace.rdb.format import RdbError
from kvguardian.keyspace.rdb.reader import RdbReader, lzf_decompress
from kvguardian.keyspace.rdb.scan import RdbSource, scan_rdb
from kvguardian.keyspace.rdb.size import je, sds


def read(data: bytes) -> tuple[RdbReader, list]:
    r = RdbReader(io.BytesIO(data))
    rows = []
    for b in r.batches():
        rows += list(zip(b.keys, b.types, b.sizes, b.expires, b.idles))
    return r, rows


def test_rdb12_records_redis_70_cannot_write():
    module_value = ln(2) + ln(5) + ln(5) + st("abc") + ln(4) + struct.pack("<d", 1.5) + ln(3) + b"\0\0\0\0" + ln(0)
    data = rdb(
        b"\xf4" + ln(7) + ln(3) + ln(1),  # SLOT_INFO
        b"\xf5" + st("#!lua name=lib\nredis.register_function('f', function() return 1 end)"),  # FUNCTION2
        b"\xf7" + ln(12345) + ln(2) + ln(1) + module_value,  # MODULE_AUX
        b"\xfc" + struct.pack("<Q", 4_000_000_000_000) + b"\xf8" + ln(300) + b"\x00" + st("plain") + st("v" * 10),
        bytes([24]) + st("hfe") + struct.pack("<Q", 1_000) + ln(2) + ln(0) + st("f1") + st("v1") + ln(5) + st("f2")
        + st("v2"),  # HASH_METADATA: min expiry, then (ttl, field, value) with ttl relative (+1)
        bytes([22]) + st("hfe-rc") + ln(1) + ln(1_700_000_000_000) + st("f") + st("v"),  # the RC format
        bytes([25]) + st("hlpex") + struct.pack("<Q", 1_000) + st(b"\x01" * 40),  # HASH_LISTPACK_EX
        bytes([7]) + st("mod") + ln(777) + module_value,  # a module value: skipped through its opcodes
        b"\xf9\x07" + bytes([20]) + st("setlp") + st(b"\x02" * 30),  # FREQ, then SET_LISTPACK
    )
    r, rows = read(data)
    assert r.done and r.version == 12 and r.functions == 1 and r.modules_skipped == 1
    keys = {k: (t, e, i) for k, t, _, e, i in rows}
    assert keys == {b"plain": (0, 4_000_000_000_000, 300), b"hfe": (4, -1, -1), b"hfe-rc": (4, -1, -1),
                    b"hlpex": (4, -1, -1), b"mod": (6, -1, -1), b"setlp": (2, -1, 7)}
    assert r.saw_idle and r.saw_freq


def test_stream_v3_with_groups_and_consumers():
    node = st(bytes(16)) + st(b"\x10" * 100)
    group = (st("g") + ln(5) + ln(0) + ln(3)  # name, last id, entries read
             + ln(1) + bytes(16) + struct.pack("<Q", 99) + ln(2)  # one pending entry
             + ln(1) + st("c") + struct.pack("<Q", 1) + struct.pack("<Q", 2) + ln(1) + bytes(16))  # a consumer
    data = rdb(bytes([21]) + st("x") + ln(2) + node + node + ln(10) + ln(5) + ln(0) + ln(1) + ln(0) + ln(0) + ln(0)
               + ln(10) + ln(1) + group)
    r, rows = read(data)
    assert [(k, t) for k, t, *_ in rows] == [(b"x", 5)] and r.done


def test_lengths_and_string_encodings():
    big = b"y" * 70_000
    data = rdb(b"\x00" + st("a") + b"\xc0\x7f", b"\x00" + st("b") + b"\xc1\x00\x80", b"\x00" + st("c") + b"\xc2"
               + struct.pack("<i", -5), b"\x00" + st("d") + st(big), b"\x00" + b"\xc0\x05" + st("int-key"))
    _r, rows = read(data)
    assert [k for k, *_ in rows] == [b"a", b"b", b"c", b"d", b"5"]
    assert rows[3][2] > 70_000  # a 70 kB value, read past the 4 kB inline window and the buffer


def test_lzf():
    # literal run "abc", then a back reference of length 6 at distance 3 (overlapping): "abcabcabc"
    assert lzf_decompress(b"\x02abc" + bytes([(4 << 5) | 0, 2]), 9) == b"abcabcabc"
    with pytest.raises(ValueError):
        lzf_decompress(b"\x02abc", 5)
    key = b"\x02abc" + bytes([(4 << 5) | 0, 2])
    _, rows = read(rdb(b"\x00" + b"\xc3" + ln(len(key)) + ln(9) + key + st("v")))
    assert rows[0][0] == b"abcabcabc"


@pytest.mark.parametrize("damage", ["truncated", "bad type"])
def test_damage_is_an_error_with_an_offset_and_keeps_what_was_read(damage):
    good = b"".join(b"\x00" + st(f"k{i}") + st("v") for i in range(100))
    last = b"\x00" + st("last") + st("x" * 50)
    data = rdb(good, last)
    at = data.index(last)
    data = data[:at + 20] if damage == "truncated" else data[:at] + b"\xee" + data[at + 1:]
    res = scan_rdb(RdbSource(io.BytesIO(data), "t"))
    assert not res.complete and res.incomplete_reason.startswith("damaged or truncated RDB at byte")
    assert ("ends" if damage == "truncated" else "unknown record type 238") in res.incomplete_reason
    assert res.keys_scanned == 100 and res.patterns  # everything before the damage
    with pytest.raises(RdbError, match="not an RDB"):
        scan_rdb(RdbSource(io.BytesIO(b"HELLO"), "t"))


def test_old_versions_are_refused_newer_ones_warned():
    with pytest.raises(RdbError, match="older than this reader reads"):
        read(rdb(version=8))
    res = scan_rdb(RdbSource(io.BytesIO(rdb(b"\x00" + st("k") + st("v"), version=13)), "t"))
    assert res.complete and any("newer than" in w for w in res.warnings)


def test_jemalloc_classes_and_sds():
    assert [je(n) for n in (1, 8, 9, 17, 128, 129, 161, 257, 4097)] == [8, 8, 16, 32, 128, 160, 192, 320, 5120]
    assert sds(10) == 16 and sds(40) == 48 and sds(300) == 320


def test_batch_sizer_fits_the_budget_and_reacts_to_slow_calls():
    s = BatchSizer(0.0005, start=50)
    for _ in range(20):
        n = s.observe(s.batch, s.batch * 5e-6)  # 5 us a key: 100 keys fit 0.5 ms
    assert 90 <= n <= 100
    assert s.observe(n, 0.003) <= n // 2  # a call over budget halves the batch at once
    assert BatchSizer(0.0005).observe(0, 0.1) == 50  # an empty batch says nothing


def test_batch_sizer_is_not_thrown_off_by_one_descheduled_call():
    s = BatchSizer(0.0005, start=50)
    for _ in range(20):
        n = s.observe(s.batch, s.batch * 5e-6)
    s.observe(n, 0.020)  # the server was descheduled mid-call: 20 ms for ~100 keys
    after = s.observe(s.batch, s.batch * 5e-6)
    assert after >= n * 0.7  # back near the budget at once: the median ignores the one outlier
    for _ in range(5):  # a real rise in cost (4x) is followed within a few calls
        m = s.observe(s.batch, s.batch * 20e-6)
    assert m <= 30


class _RecordAtATime(RdbReader):
    """The reader with its inline path off: every record goes through `_record`."""

    def _fast(self, out, buf, pos):  # type: ignore[no-untyped-def]
        return pos


def _mixed_records(n: int, *, lfu: bool) -> bytes:
    """Every prefix and value form the inline path reads, and some it hands on, interleaved."""
    out = []
    for i in range(n):
        pre = b""
        if i % 3 == 0:
            pre += b"\xfc" + struct.pack("<Q", 1_700_000_000_000 + i)
        if lfu:
            pre += b"\xf9" + bytes([i % 256]) if i % 4 else b""
        elif i % 5 == 1:
            pre += b"\xf8" + ln(i % 60)  # 6-bit idle
        elif i % 5 == 2:
            pre += b"\xf8" + ln(100 + i)  # 14-bit idle
        elif i % 5 == 3:
            pre += b"\xf8" + ln(70_000 + i)  # 32-bit idle: not inline
        key = st(f"k:{i}") if i % 11 else st("long:" + "x" * 70 + str(i))  # a 14-bit key length: not inline
        form = i % 7
        if form == 0:
            rec = b"\x00" + key + st("v" * (i % 50))
        elif form == 1:
            rec = b"\x00" + key + b"\xc0" + bytes([i % 128])  # an 8-bit integer
        elif form == 2:
            rec = b"\x00" + key + st("w" * (100 + i % 300))  # a 14-bit value length
        elif form == 3:
            rec = b"\x10" + key + st(b"\x00" * (20 + i % 30))  # a listpack hash
        elif form == 4:
            rec = b"\x12" + key + ln(2) + (ln(2) + st(b"\x01" * 12)) * 2  # a quicklist of two listpacks
        elif form == 5:
            rec = b"\x02" + key + ln(2) + st("a") + st("b")  # a hash-table set: not inline
        else:
            rec = b"\x00" + key + b"\xc3" + ln(3) + ln(9) + b"\x00ab"  # LZF, short lengths
        out.append(pre + rec)
    return b"".join(out)


class _Counting(RdbReader):
    inline = 0

    def _columns(self, buf, starts, sizes):  # type: ignore[no-untyped-def]
        self.inline += len(starts)
        return super()._columns(buf, starts, sizes)


@pytest.mark.parametrize("lfu", [False, True])
def test_inline_path_reads_what_the_record_path_reads(lfu):
    data = rdb(_mixed_records(3000, lfu=lfu))
    fast, slow = _Counting(io.BytesIO(data), batch=512), _RecordAtATime(io.BytesIO(data), batch=512)
    got = [(b.db, b.keys, b.cols.tolist()) for b in fast.batches()]
    want = [(b.db, b.keys, b.cols.tolist()) for b in slow.batches()]
    assert sum(len(k) for _, k, _ in got) == 3000
    assert got == want
    assert fast.inline > 1500  # most records took the inline path (the rest: the forms it hands on)
    assert (fast.saw_idle, fast.saw_freq) == (slow.saw_idle, slow.saw_freq) == (not lfu, lfu)


def test_size_tables_match_the_size_functions():
    from kvguardian.keyspace.rdb import reader
    from kvguardian.keyspace.rdb.size import string_bytes

    assert [je(n) for n in range(1 << 14)] == reader._JE
    assert [string_bytes(n, False) for n in range(1 << 14)] == reader._STR_SIZE


@pytest.mark.parametrize("expire", [-5, -(2**63), 2**63 - 1, 0])
def test_any_int64_expiry_reads_the_same_on_both_paths_and_never_means_no_ttl(expire):
    """EXPIRETIME_MS is a signed int64 in Redis; one before 1970 (a hand-made or damaged file) is a key that
    expired long ago, not "no TTL" and not a reader failure (it was OverflowError on the record path)."""
    recs = b"".join(b"\xfc" + struct.pack("<q", expire) + b"\x00" + st(f"k:{i}") + st("v") for i in range(400))
    data = rdb(recs)
    fast, slow = RdbReader(io.BytesIO(data), batch=512), _RecordAtATime(io.BytesIO(data), batch=512)
    got = [e for b in fast.batches() for e in b.expires.tolist()]
    assert got == [e for b in slow.batches() for e in b.expires.tolist()] == [max(expire, 0)] * 400
    res = scan_rdb(RdbSource(io.BytesIO(data), "t"))
    assert res.complete and res.keys_scanned == 400


@pytest.mark.parametrize("ctime", ["abc", "-1", "9" * 30, "\u00b2", ""])
def test_an_aux_number_that_is_not_one_is_a_warning_not_an_internal_error(ctime):
    data = b"REDIS0012" + st_aux("ctime", ctime) + st_aux("used-mem", ctime) + b"\xfe\x00" \
        + b"\xfc" + struct.pack("<q", 2**62) + b"\x00" + st("k") + st("v") + b"\xff" + bytes(8)
    res = scan_rdb(RdbSource(io.BytesIO(data), "t"))
    assert res.complete and res.keys_scanned == 1
    assert res.server["rdb"]["ctime"] == 0 and res.server["rdb"]["used_mem"] == 0
    assert sum("AUX field" in w for w in res.warnings) == 2


@pytest.mark.parametrize("record", [
    b"\x00" + ln(2**62) + b"abc",  # a key length no file holds: read(2**62) was a MemoryError
    b"\x00" + st("k") + b"\xc3" + ln(3) + ln(2**62) + b"\x00ab",  # an LZF value "of 4 EiB" in 3 bytes
    b"\x00" + b"\xc3" + ln(3) + ln(2**40) + b"\x00ab" + st("v"),  # an LZF key the same way
])
def test_a_length_the_file_cannot_hold_is_damage_not_a_crash_or_a_huge_key(record, tmp_path):
    good = b"".join(b"\x00" + st(f"k{i}") + st("v") for i in range(20))
    (tmp_path / "d.rdb").write_bytes(rdb(good, record))
    with open(tmp_path / "d.rdb", "rb") as f:  # a real file: its read(n) allocates n bytes first
        res = scan_rdb(RdbSource(f, "t"))
    assert not res.complete and res.incomplete_reason.startswith("damaged or truncated RDB at byte")
    assert "MemoryError" not in res.incomplete_reason
    assert res.keys_scanned == 20 and res.bytes < 10_000


def test_lzf_at_its_densest_is_read():
    """LZF's best ratio (a run of one byte) is 88: the damage check above must not refuse it."""
    n, clen = 10_000_000, 113_643  # what Redis 7 writes for SET a <10 MB of 'a'> (measured)
    res = scan_rdb(RdbSource(io.BytesIO(rdb(b"\x00" + st("a") + b"\xc3" + ln(clen) + ln(n) + bytes(clen))), "t"))
    assert res.complete and res.keys_scanned == 1
