"""The cross-rank consistency check with 2 real gloo processes on loopback (no model: tracked tensors only)."""

import multiprocessing as mp
import traceback
from datetime import timedelta

import pytest
import torch.distributed  # noqa: F401 - imported once here, inherited by the forked ranks
from tests.conftest import free_port

import kvguardian.runtime.guard
import kvguardian.runtime.ranks  # noqa: F401 - likewise

KEPT = []  # rank 0's leak: KV of a finished sequence kept here


def _rank(rank, port, out):
    import torch
    import torch.distributed as dist

    from kvguardian.runtime.guard import Guard
    from kvguardian.runtime.ranks import check_ranks

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=60))
        guard = Guard()
        for sid in ("s0", "s1", "s2"):
            with guard.request(sid):
                k, v = torch.zeros(1, 2, 16, 8), torch.zeros(1, 2, 16, 8)
                guard.track(k, v, layer=0)
                if rank == 0 and sid == "s1":
                    KEPT.append((k, v))
            del k, v
        with guard.request("live"):  # active on both ranks while checked: consistent
            live = torch.zeros(1, 2, 4, 8)
            guard.track(live, layer=1)
            report = check_ranks(guard)
            exact = check_ranks(guard, exact_bytes=True)
        out.put({"rank": rank, "report": report.to_dict(), "exact": len(exact.findings)})
    except BaseException:
        out.put({"rank": rank, "error": traceback.format_exc()})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_divergence_between_two_gloo_ranks_is_kvg106_on_every_rank():
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("needs the fork start method")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = sorted((out.get(timeout=120) for _ in procs), key=lambda r: r["rank"])
    finally:
        for p in procs:
            p.join(timeout=30)
    assert all("error" not in r for r in results), results
    for r in results:  # the same report on both ranks
        findings = r["report"]["findings"]
        assert [f["id"] for f in findings] == ["KVG106"]
        f = findings[0]
        assert f["message"] == (
            "sequence 's1': KV alive on rank 0 (rank 0: 2048 bytes in 2 storages; its owner ended) but not on rank 1"
        )
        assert f["evidence"]["bytes_by_rank"] == {"0": 2048, "1": 0}
        assert r["report"]["summary"]["ranks"] == 2
        assert r["report"]["summary"]["sequences_compared"] == 2  # s1 and the live one
        assert r["exact"] == 1


def test_check_ranks_without_a_process_group_is_a_usage_error():
    from kvguardian.core.errors import UsageError
    from kvguardian.runtime.guard import Guard
    from kvguardian.runtime.ranks import check_ranks

    with pytest.raises(UsageError, match=r"needs an initialized torch\.distributed process group"):
        check_ranks(Guard())
