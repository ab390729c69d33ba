"""The ownership check, written in Triton itself so it runs the same in interpret mode and on a GPU.

For every element an access touches, the offset from the KV cache's base gives the block and slot, which must
be in the current sequence's row of the ownership table (and, for loads, below its length). Violations are
counted into a small int64 buffer that also describes the first one; no ``device_assert`` (it does not fire
in interpret mode and aborts the context on a GPU). The buffer layout: docs/design/triton.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["BUFFER_HEADER", "kv_check"]

BUFFER_HEADER = 16


@triton.jit
def _owner_of(block, bt, bt_stride, lens, nseq, BS: tl.constexpr, MAXB: tl.constexpr):
    idx = tl.arange(0, MAXB)
    owner = -1
    for s in range(0, nseq):
        n_s = tl.cdiv(tl.load(lens + s), BS)
        row = tl.load(bt + s * bt_stride + idx, mask=idx < n_s, other=-1)
        hit = tl.sum((row == block).to(tl.int32), axis=0)
        owner = tl.where(hit > 0, s, owner)
    return owner


@triton.jit
def kv_check(ptr, mask, base, blk_bytes, slot_bytes, bt, bt_stride, lens, nseq, seq, buf,
             SITE: tl.constexpr, IS_LOAD: tl.constexpr, BS: tl.constexpr, MAXB: tl.constexpr):
    off = ptr.to(tl.int64, bitcast=True) - base.to(tl.int64, bitcast=True)
    off = off + tl.zeros([1], tl.int64)  # a scalar access becomes a 1-element tensor
    live = (tl.zeros_like(off) + mask) != 0
    off = tl.reshape(off, [off.numel])
    live = tl.reshape(live, [live.numel])
    block = off // blk_bytes
    slot = (off % blk_bytes) // slot_bytes % BS
    length = tl.load(lens + seq)
    idx = tl.arange(0, MAXB)
    row = tl.load(bt + seq * bt_stride + idx, mask=idx < tl.cdiv(length, BS), other=-1)
    logical = tl.max(tl.where(block[:, None] == row[None, :], idx[None, :], -1), axis=1)
    pos = logical * BS + slot
    ok = logical >= 0
    if IS_LOAD:
        ok = ok & (pos < length)
    bad = live & (ok == 0)
    n = tl.sum(bad.to(tl.int64), axis=0)
    if n > 0:
        tl.atomic_add(buf + 16 + SITE, n)
        tl.atomic_add(buf, n)
        if tl.atomic_xchg(buf + 1, 1) == 0:
            lane = tl.arange(0, off.numel)
            first = tl.min(tl.where(bad, lane, off.numel), axis=0)
            fblock = tl.sum(tl.where(lane == first, block, 0), axis=0)
            fpos = tl.sum(tl.where(lane == first, tl.where(logical >= 0, pos, -1), 0), axis=0)
            pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0) \
                + tl.program_id(2) * tl.num_programs(0) * tl.num_programs(1)
            tl.store(buf + 2, pid.to(tl.int64))
            tl.store(buf + 3, seq.to(tl.int64))
            tl.store(buf + 4, fblock)
            tl.store(buf + 5, tl.sum(tl.where(lane == first, slot, 0), axis=0))
            tl.store(buf + 6, _owner_of(fblock, bt, bt_stride, lens, nseq, BS, MAXB).to(tl.int64))
            tl.store(buf + 7, SITE)
            tl.store(buf + 8, fpos)
