"""Small kernels with the faults the sanitizer must catch, switched by constexpr parameters.

`scores_kernel` reads K through a block table (q·k per token, one KV head); ``OVERREAD=1`` lets its mask
through one slot past the length, ``ROW_SHIFT=1`` makes it index the next sequence's block-table row.
`append_kv_kernel` writes one new token's K at the slot its slot mapping names.
"""

import triton
import triton.language as tl


@triton.jit
def scores_kernel(q, k_cache, block_table, seq_lens, out, stride_kb, stride_ks, stride_bt, stride_out, num_seqs,
                  HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, OVERREAD: tl.constexpr,
                  ROW_SHIFT: tl.constexpr):
    seq = tl.program_id(0)
    row = (seq + ROW_SHIFT) % num_seqs
    n = tl.load(seq_lens + seq)
    d = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    qv = tl.load(q + seq * HEAD_DIM + d)
    for i in range(0, tl.cdiv(n, BLOCK_SIZE)):
        block = tl.load(block_table + row * stride_bt + i)
        pos = i * BLOCK_SIZE + slots
        ptrs = k_cache + block * stride_kb + slots[:, None] * stride_ks + d[None, :]
        k = tl.load(ptrs, mask=(pos < n + OVERREAD)[:, None], other=0.0)
        tl.store(out + seq * stride_out + pos, tl.sum(k * qv[None, :], axis=1), mask=pos < n)


@triton.jit
def append_kv_kernel(k_new, k_cache, slot_mapping, stride_kb, stride_ks, HEAD_DIM: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
    seq = tl.program_id(0)
    slot = tl.load(slot_mapping + seq)
    d = tl.arange(0, HEAD_DIM)
    dst = k_cache + (slot // BLOCK_SIZE) * stride_kb + (slot % BLOCK_SIZE) * stride_ks + d
    tl.store(dst, tl.load(k_new + seq * HEAD_DIM + d))


def no_kv_kernel(x, y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)
