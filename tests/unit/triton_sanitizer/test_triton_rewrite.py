"""The sanitizer's AST rewrite, without Triton: which accesses are checked, and the one-line refusals."""

import ast

import pytest

from kvguardian.triton.rewrite import SanitizerError, rewrite_kernel

KERNEL = '''@triton.jit
def kern(q, k_cache, v_cache, bt, lens, out, BS: tl.constexpr):
    seq = tl.program_id(0)
    qv = tl.load(q + seq)
    base = k_cache + seq * 4
    ptrs = base + tl.arange(0, BS)
    k = tl.load(ptrs, mask=tl.arange(0, BS) < 3, other=0.0)
    for i in range(0, 2):
        v = tl.load(v_cache + i)
    tl.store(k_cache + 1, k + v, tl.arange(0, BS) < 2)
    tl.store(out + seq, qv)
'''


def test_checks_every_kv_access_through_derived_pointers_and_only_those():
    rw = rewrite_kernel(KERNEL, caches=("k_cache", "v_cache"), first_line=10)
    assert [(s.kind, s.cache, s.line) for s in rw.sites] == [
        ("load", "k_cache", 16), ("load", "v_cache", 18), ("store", "k_cache", 19)]
    assert rw.sites[0].text == "k = tl.load(ptrs, mask=tl.arange(0, BS) < 3, other=0.0)"
    fn = ast.parse(rw.source).body[0]
    assert isinstance(fn, ast.FunctionDef) and not fn.decorator_list
    params = [a.arg for a in fn.args.args]
    assert params[:7] == ["q", "k_cache", "v_cache", "bt", "lens", "out", "BS"]
    assert {"_kvg_buf", "_kvg_blk_k_cache", "_kvg_slot_v_cache", "_KVG_MAXB"} <= set(params)
    assert rw.source.count("_kvg_kv_check(") == 3
    assert "tl.load(_kvg_p0, mask=_kvg_m0, other=0.0)" in rw.source  # the access uses the checked values
    assert "tl.store(_kvg_p2, k + v, _kvg_m2)" in rw.source
    assert "tl.load(q + seq)" in rw.source and "tl.store(out + seq, qv)" in rw.source  # untouched


def test_refusals_are_one_clear_line():
    with pytest.raises(SanitizerError, match=r"^kern: no tl.load/tl.store goes through the KV-cache pointer\(s\) "
                                             r"bt; nothing to check"):
        rewrite_kernel(KERNEL, caches=("bt",), kernel_name="kern")
    with pytest.raises(SanitizerError, match=r"kv_caches names 'kv', not parameters of the kernel"):
        rewrite_kernel(KERNEL, caches=("kv",), kernel_name="kern")
    header = "def f(k_cache, n):\n    while tl.load(k_cache) > 0:\n        n += 1\n"
    with pytest.raises(SanitizerError, match=r"in the header of a while statement \(line 2\)"):
        rewrite_kernel(header, caches=("k_cache",))
