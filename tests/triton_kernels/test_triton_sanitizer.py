"""The paged decode-attention kernel against the project's PyTorch paged attention, and the KV-ownership
sanitizer on the faults it must catch (interpret mode on the CPU; the same code runs compiled on a GPU)."""

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton", reason="Triton tests run in .venv-triton (scripts/test.sh)")

import torch.nn.functional as F  # noqa: E402
from faulty_kernels import append_kv_kernel, no_kv_kernel, scores_kernel  # noqa: E402

from kvguardian.runtime.paged import KVSpec, PagedKVPool  # noqa: E402
from kvguardian.triton import SanitizerError, paged_decode, sanitize  # noqa: E402
from kvguardian.triton.paged_attention import paged_decode_kernel  # noqa: E402

BS = 16


def _pool(lens, kv_heads=2, head_dim=16, num_blocks=32, seed=0):
    """A PagedKVPool holding random K/V for sequences r0, r1, … of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    pool = PagedKVPool(num_blocks=num_blocks, block_size=BS, kv=KVSpec(num_layers=1, kv_heads=kv_heads,
                                                                       head_dim=head_dim))
    for i, n in enumerate(lens):
        rid = f"r{i}"
        pool.open(rid, tenant="t")
        slots = torch.from_numpy(pool.append(rid, list(range(1000 * i, 1000 * i + n)))).long()
        pool.write(rid, 0, slots, torch.randn(n, kv_heads, head_dim, generator=g),
                   torch.randn(n, kv_heads, head_dim, generator=g))
    return pool


def _tables(pool, rids, lens=None):
    """The ownership view of the pool: [len(rids), max_blocks] block table and lengths (0 for a closed table)."""
    rows = [pool.block_ids(r) if pool.has_table(r) else [] for r in rids]
    width = max(1, max(len(r) for r in rows))
    bt = torch.zeros(len(rids), width, dtype=torch.int32)
    for i, r in enumerate(rows):
        bt[i, :len(r)] = torch.as_tensor(r, dtype=torch.int32)
    sl = torch.tensor(lens if lens is not None else [pool.table(r).num_tokens if pool.has_table(r) else 0
                                                    for r in rids], dtype=torch.int32)
    return bt, sl


def _reference(pool, q, lens, rids):
    heads, kv_heads, d = q.shape[1], pool.kv.kv_heads, pool.kv.head_dim
    outs = []
    for i, (rid, n) in enumerate(zip(rids, lens)):
        kc, vc = pool.gather(0, torch.from_numpy(pool.block_ids(rid)).long(), n)  # [n, H_kv, D]
        kc = kc.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)  # [H, n, D]
        vc = vc.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        outs.append(F.scaled_dot_product_attention(q[i][:, None, :], kc, vc, scale=d ** -0.5)[:, 0])
    return torch.stack(outs)


def _sanitized_scores():
    return sanitize(scores_kernel, kv_caches=("k_cache",), block_table="block_table", seq_lens="seq_lens",
                    block_size="BLOCK_SIZE")


def _scores(kernel, pool, bt, sl, overread=0, row_shift=0):
    k = pool.k[0][:, :, :1, :]  # one KV head: [blocks, BS, 1, D] (a view of the pool's storage)
    n, d = len(sl), pool.kv.head_dim
    q = torch.randn(n, d)
    out = torch.zeros(n, bt.shape[1] * BS)
    kernel[(n,)](q, k, bt, sl, out, k.stride(0), k.stride(1), bt.stride(0), out.stride(0), n,
                 HEAD_DIM=d, BLOCK_SIZE=BS, OVERREAD=overread, ROW_SHIFT=row_shift)
    return out


@pytest.mark.parametrize("lens,heads", [([5, 16, 37, 20], 4), ([1, 33, 64], 8), ([100], 2)])
def test_paged_decode_kernel_matches_pytorch_paged_attention(lens, heads):
    pool = _pool(lens)
    rids = [f"r{i}" for i in range(len(lens))]
    bt, sl = _tables(pool, rids)
    q = torch.randn(len(lens), heads, pool.kv.head_dim, generator=torch.Generator().manual_seed(1))
    out = paged_decode(q, pool.k[0], pool.v[0], bt, sl)
    torch.testing.assert_close(out, _reference(pool, q, lens, rids), rtol=1e-5, atol=1e-5)


def test_clean_kernel_no_violation_and_bit_identical_outputs():
    lens = [5, 16, 37, 20, 1]
    pool = _pool(lens)
    bt, sl = _tables(pool, [f"r{i}" for i in range(len(lens))])
    q = torch.randn(len(lens), 4, pool.kv.head_dim)
    checked = sanitize(paged_decode_kernel, kv_caches=("k_cache", "v_cache"), block_table="block_table",
                       seq_lens="seq_lens", block_size="BLOCK_SIZE")
    plain = paged_decode(q, pool.k[0], pool.v[0], bt, sl)
    with_check = paged_decode(q, pool.k[0], pool.v[0], bt, sl, kernel=checked)
    assert torch.equal(plain, with_check)
    assert checked.launches == 1 and checked.findings() == []
    assert [s.kind for s in checked.sites] == ["load", "load"] and {s.cache for s in checked.sites} == {
        "k_cache", "v_cache"}
    clean_scores = _sanitized_scores()
    _scores(clean_scores, pool, bt, sl)
    assert clean_scores.findings() == []


def test_reading_one_slot_past_the_sequence_length_in_the_last_block():
    lens = [5, 37, 20]  # none a multiple of 16: slot `len` is inside the last block
    pool = _pool(lens)
    bt, sl = _tables(pool, ["r0", "r1", "r2"])
    checked = _sanitized_scores()
    _scores(checked, pool, bt, sl, overread=1)
    [f] = checked.findings()
    assert f.id == "KVG210" and f.severity.value == "error"
    ev = f.evidence
    assert ev["count"] == 3 * pool.kv.head_dim  # one extra slot (head_dim elements) per sequence
    assert ev["owner"] == ev["sequence"] and ev["position"] == lens[ev["sequence"]]
    n = lens[ev["sequence"]]
    assert ev["slot"] == n % BS and ev["block"] == int(bt[ev["sequence"], n // BS])
    assert ev["line"] > 0 and "tl.load(ptrs" in ev["statement"] and ev["file"].endswith("faulty_kernels.py")
    assert f"faulty_kernels.py:{ev['line']}" in f.message and "past its length" in f.message


def test_reading_a_neighbour_sequences_block_table_row():
    lens = [20, 20, 20]
    pool = _pool(lens)
    bt, sl = _tables(pool, ["r0", "r1", "r2"])
    checked = _sanitized_scores()
    _scores(checked, pool, bt, sl, row_shift=1)
    [f] = checked.findings()
    ev = f.evidence
    assert f.id == "KVG210" and ev["count"] == sum(lens) * pool.kv.head_dim  # every read is a neighbour's
    assert ev["owner"] == (ev["sequence"] + 1) % 3 and ev["position"] == -1
    assert f"owned by sequence {ev['owner']}" in f.message
    assert 0 <= ev["block"] < pool.num_blocks  # inside the pool's one allocation: invisible to compute-sanitizer


def test_reading_a_block_freed_and_reassigned_to_another_request():
    pool = _pool([20, 10], num_blocks=4)  # r0 holds 2 blocks, r1 holds 1, one free
    stale_bt, stale_sl = _tables(pool, ["r0", "r1"])  # the kernel's copy, taken before the free
    freed = set(pool.block_ids("r0").tolist())
    pool.free("r0")
    pool.open("r2", tenant="t")
    pool.append("r2", list(range(40)))  # 3 blocks: r0's two freed ones and the spare
    assert freed <= set(pool.block_ids("r2").tolist())
    truth_bt, truth_sl = _tables(pool, ["r0", "r1", "r2"])  # the allocator's view: r0 owns nothing now
    checked = sanitize(scores_kernel, kv_caches=("k_cache",), block_table=truth_bt, seq_lens=truth_sl,
                       block_size=BS)
    _scores(checked, pool, stale_bt, stale_sl)  # the kernel still reads r0 through its stale table
    [f] = checked.findings()
    ev = f.evidence
    assert f.id == "KVG210" and ev["sequence"] == 0 and ev["block"] in freed
    assert ev["owner"] == 2 and ev["count"] == 20 * pool.kv.head_dim  # all of r0's reads, none of r1's
    assert "owned by sequence 2" in f.message
    assert 0 <= ev["block"] < pool.num_blocks  # in bounds and initialised (r2 owns it): memcheck/initcheck are silent


def test_writing_into_a_block_the_request_does_not_own():
    pool = _pool([20, 7])
    bt, sl = _tables(pool, ["r0", "r1"])
    k = pool.k[0][:, :, :1, :]
    d = pool.kv.head_dim
    r1_block = int(pool.block_ids("r1")[0])
    own_slot = int(bt[0, 1]) * BS + 4  # r0's token 20: its own second block
    foreign_slot = r1_block * BS + 3  # r1's block: a stale or corrupted slot mapping
    checked = sanitize(append_kv_kernel, kv_caches=("k_cache",), block_table=bt, seq_lens=sl + 1, block_size=BS)
    for slot, expect in ((own_slot, []), (foreign_slot, ["KVG202"])):
        slots = torch.tensor([slot, int(bt[1, 0]) * BS + 7])  # r1 appends its own token 7 correctly
        checked[(2,)](torch.randn(2, d), k, slots, k.stride(0), k.stride(1), HEAD_DIM=d, BLOCK_SIZE=BS)
        found = checked.take_violations()
        assert [("KVG202" if v.site.kind == "store" else "KVG210") for v in found] == expect
    checked[(1,)](torch.randn(1, d), k, torch.tensor([foreign_slot]), k.stride(0), k.stride(1), HEAD_DIM=d,
                  BLOCK_SIZE=BS)
    [f] = checked.findings()
    ev = f.evidence
    assert f.id == "KVG202" and ev["owner"] == 1 and ev["block"] == r1_block and ev["slot"] == 3
    assert "wrote slot 3" in f.message


def test_a_kernel_the_sanitizer_cannot_rewrite_is_one_clear_error():
    jitted = triton.jit(no_kv_kernel)
    with pytest.raises(SanitizerError, match=r"no_kv_kernel: no tl.load/tl.store goes through the KV-cache "
                                             r"pointer\(s\) n; nothing to check"):
        sanitize(jitted, kv_caches=("n",), block_table="x", seq_lens="n", block_size=16)
    with pytest.raises(SanitizerError, match=r"kv_caches names 'k_cache', not parameters of the kernel"):
        sanitize(jitted, kv_caches=("k_cache",), block_table="x", seq_lens="n", block_size=16)
    with pytest.raises(SanitizerError, match=r"is not a @triton.jit kernel"):
        sanitize(42, kv_caches=("x",), block_table="x", seq_lens="n", block_size=16)
