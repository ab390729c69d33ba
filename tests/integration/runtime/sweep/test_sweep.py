"""The sweep on real CPU attention: SDPA backends, the floor/ceil controls, layouts, an allocator-only leak."""

import json

import pytest
import torch
import torch.nn.functional as F

from kvguardian.apps.repro import nonpow2
from kvguardian.runtime.sweep import SweepConfig, Target, resolve_targets, run_sweep

CPU = torch.device("cpu")
LENGTHS = [1, 63, 64, 65, 127, 128]
CFG = SweepConfig(heads=2, head_dim=32, repeats=2)

_WORKSPACES = []


def workspace_leak(q, k, v, is_causal=False):
    """Leaks a workspace of its own (never q, k or v): only the allocator probe can see it."""
    _WORKSPACES.append(torch.ones(64 * 1024))  # 256 KiB per call
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def bshd_attention(q, k, v, causal=False):
    """flash_attn_func's layout: [B, S, H, D]."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=causal).transpose(1, 2)


def varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
    """flash_attn_varlen_func's layout: [total, H, D] packed, sequences delimited by cu_seqlens."""
    outs = []
    for i in range(len(cu_q) - 1):
        a, b = int(cu_q[i]), int(cu_q[i + 1])
        qi, ki, vi = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))
        outs.append(F.scaled_dot_product_attention(qi, ki, vi, is_causal=causal)[0].transpose(0, 1))
    return torch.cat(outs)


def test_sdpa_backends_return_memory_at_every_length():
    targets, notes = resolve_targets(["sdpa"], device=CPU, dtype=torch.float32)
    names = [t.name for t in targets]
    assert "sdpa-math" in names and "sdpa-flash" in names
    assert "paged" in names  # the paged pool's attention is swept by default now that it is installed
    assert any("sdpa-efficient skipped on cpu" in n for n in notes)
    res = run_sweep(targets, LENGTHS, CFG)
    assert res.ok, res.verdict()
    assert all(r.alive_bytes == [0, 0] for r in res.rows)
    assert all(r.max_abs_err is not None and r.max_abs_err < 1e-4 for r in res.rows)
    assert res.probes["malloc"] == "ok" and res.probes["cuda"] == "no CUDA device in use"
    assert res.verdict().startswith(
        f"PASS: memory returned to baseline after every call: 6 lengths × {len(targets)} target(s)")


def test_floor_release_control_is_caught_exactly_where_the_length_is_not_a_block_multiple():
    try:
        res = run_sweep([Target("floor", nonpow2.leaky_blockwise_attention, "bhsd", "is_causal"),
                         Target("ceil", nonpow2.fixed_blockwise_attention, "bhsd", "is_causal")], LENGTHS, CFG)
    finally:
        nonpow2._STAGED.clear()
    floor = {r.length: r for r in res.rows if r.target == "floor"}
    assert sorted(n for n, r in floor.items() if r.verdict == "LEAK") == [1, 63, 65, 127]
    per_call_kv = 2 * 2 * 65 * 32 * 4
    assert floor[65].alive_bytes == [per_call_kv, 2 * per_call_kv]  # both calls' K and V still alive
    assert floor[65].holder_chain[0] == "module kvguardian.apps.repro.nonpow2: _STAGED"
    assert floor[65].holder_chain[1].startswith("list[") and floor[65].holder_chain[2] == "tuple[0]"
    assert all(r.verdict in ("ok", "one-time") for r in res.rows if r.target == "ceil")
    assert res.verdict().startswith("FAIL: floor: LEAK at 4 of 6 lengths (1, 63, 65, 127)")
    assert {f.id for f in res.report.findings} >= {"KVG102"}


def test_a_leak_outside_qkv_is_caught_by_the_allocator_probe():
    try:
        res = run_sweep([Target("ws", workspace_leak, "bhsd", "is_causal")], [16, 17], SweepConfig(repeats=3))
    finally:
        _WORKSPACES.clear()
    assert [r.length for r in res.rows] == [16, 17]  # the loop below must not pass on no rows
    for r in res.rows:
        assert r.verdict == "LEAK" and r.alive_bytes == [0, 0, 0]
        assert any("C allocator in-use bytes grew after every call" in why for why in r.reasons)
        assert r.growth_per_call() == pytest.approx(256 * 1024, rel=0.05)


@pytest.mark.parametrize(("fn", "layout"), [(bshd_attention, "bshd"), (varlen_attention, "varlen")])
def test_flash_attn_layouts_are_adapted(fn, layout):
    target = Target(f"test:{layout}", fn, layout, "causal")
    res = run_sweep([target], [1, 33], SweepConfig(batch=2, heads=2, head_dim=16, repeats=2))
    assert res.ok, [r.reasons for r in res.rows]
    assert all(r.max_abs_err < 1e-5 for r in res.rows)


def test_cyclic_garbage_holding_kv_is_not_a_leak():
    class Node:
        pass

    def cyclic(q, k, v, is_causal=False):
        a, b = Node(), Node()
        a.other, b.other, a.kv = b, a, (k, v)  # unreachable after return, freed only by the cycle collector
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    res = run_sweep([Target("cyclic", cyclic, "bhsd", "is_causal")], [32, 33], CFG)
    assert [r.verdict for r in res.rows] == ["ok", "ok"]
    assert all(r.alive_bytes[-1] == 0 for r in res.rows)


def test_wrong_results_are_reported():
    def off_by_one_block(q, k, v, is_causal=False):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        out[:, :, -(q.shape[2] % 64 or 64):] = 0  # the partial block never computed
        return out

    res = run_sweep([Target("skip", off_by_one_block, "bhsd", "is_causal")], [64, 65], CFG)
    assert [r.verdict for r in res.rows] == ["WRONG", "WRONG"]


def test_cli_json(kv_cli):
    code, out, err = kv_cli("sweep", "--attn", "sdpa-flash", "--lengths", "31-33", "--heads", "1", "--repeats", "2",
                            "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] and [r["length"] for r in data["rows"]] == [31, 32, 33]
    assert data["rows"][0]["kind"] == "2^5-1" and data["targets"] == ["sdpa-flash"]


def test_cli_table_and_exit_code_on_a_leak(capsys):
    from kvguardian.apps.cli import main

    try:
        code = main(["sweep", "--attn", "kvguardian.apps.repro.nonpow2:leaky_blockwise_attention", "--lengths", "64,65",
                     "--repeats", "2", "--threads", "1"])
    finally:
        nonpow2._STAGED.clear()
    out = capsys.readouterr().out
    assert code == 1
    assert "verdict: FAIL: kvguardian.apps.repro.nonpow2:leaky_blockwise_attention: LEAK at 1 of 2 lengths (65)" in out
    assert "held by: module kvguardian.apps.repro.nonpow2: _STAGED" in out


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--attn", "nosuchmodule:fn"], 3, "module 'nosuchmodule' cannot be imported"),
        (["--attn", "json:nosuch"], 2, "json has no attribute 'nosuch'"),
        (["--attn", "json"], 2, "--attn 'json' is unknown"),
        (["--attn", "sdpa-efficient"], 3, "failed a 5-token causal call on cpu"),
        (["--device", "cuda"], 3, "CUDA is not available on this machine"),
        (["--lengths", "9-3"], 2, "'9-3' is not a length or a range"),
        (["--heads", "0"], 2, "--heads 0 is out of range"),
    ],
)
def test_cli_errors_are_one_line(capsys, args, code, needle):
    from kvguardian.apps.cli import main

    assert main(["sweep", *args]) == code
    err = capsys.readouterr().err
    assert needle in err and "fix:" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_paged_pool_target():
    targets, _ = resolve_targets(["paged"], device=CPU, dtype=torch.float32)
    res = run_sweep(targets, [1, 15, 16, 17, 63, 64, 65], SweepConfig(batch=2, heads=2, head_dim=16, repeats=2))
    assert [t.name for t in targets] == ["paged"]
    assert res.ok, res.verdict()
    assert all(r.max_abs_err < 1e-5 for r in res.rows)


def flaky_attention(q, k, v, is_causal=False):
    """Fails differently at three lengths: raises at 63, returns None at 64, the wrong shape at 65."""
    n = q.shape[2]
    if n == 63:
        raise RuntimeError("kernel launch failed at 63")
    if n == 64:
        return None
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    return out[:, :, :-1] if n == 65 else out


def test_a_callable_failing_at_some_lengths_gives_error_rows_and_the_sweep_goes_on():
    """Issue 13 item 13: one raising length (or None, or a wrong shape) used to lose the whole sweep."""
    res = run_sweep([Target("flaky", flaky_attention, "bhsd", "is_causal")], LENGTHS, CFG)
    by_len = {r.length: r for r in res.rows}
    assert [r.length for r in res.rows] == LENGTHS, "every length has a row"
    assert by_len[63].verdict == "ERROR" and "RuntimeError: kernel launch failed at 63" in by_len[63].reasons[0]
    assert by_len[64].verdict == "ERROR" and "returned NoneType, not an attention output" in by_len[64].reasons[0]
    assert by_len[65].verdict == "ERROR" and "returned shape (1, 2, 64, 32), expected (1, 2, 65, 32)" in \
        by_len[65].reasons[0]
    assert all(by_len[n].verdict == "ok" for n in (1, 127, 128))
    assert not res.ok and "ERROR at 3 of 6 lengths" in res.verdict()
    json.dumps(res.to_dict())
