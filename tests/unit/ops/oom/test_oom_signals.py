"""CUDA and NVML signals against fakes (no GPU here; the real paths run when a GPU machine is lent), NVML
absent for real, the pool and ledger signals on real objects, and the KV budget's sources and bad values."""

from types import SimpleNamespace

import pytest

from kvguardian.core.errors import UsageError
from kvguardian.core.ledger import Ledger
from kvguardian.ops.oom.budget import MIB, kv_budget
from kvguardian.ops.oom.signals import CudaSignal, LedgerBudgetSignal, NvmlSignal, PoolSignal, SignalUnavailable
from kvguardian.ops.oom.signals.nvml import device_memory
from kvguardian.runtime.paged import PagedKVPool


class FakeCuda:
    def __init__(self, total=80 << 30, free=20 << 30, devices=2, fail=False):
        self.total, self.free, self.devices, self.fail = total, free, devices, fail

    def is_available(self):
        return self.devices > 0

    def device_count(self):
        return self.devices

    def mem_get_info(self, device):
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.free, self.total

    def memory_reserved(self, device):
        return 50 << 30

    def memory_allocated(self, device):
        return 45 << 30


def test_cuda_signal_reads_device_wide_used_and_the_allocator():
    cuda = FakeCuda()
    r = CudaSignal(1, torch=SimpleNamespace(cuda=cuda)).read()
    assert (r.signal, r.used, r.limit) == ("cuda:1", 60 << 30, 80 << 30)
    assert r.extra == {"reserved": float(50 << 30), "allocated": float(45 << 30)}
    cuda.fail = True
    bad = CudaSignal(0, torch=SimpleNamespace(cuda=cuda)).read()
    assert not bad.ok and "illegal memory access" in bad.error  # fail-open: a reading, not a raise


def test_cuda_signal_refuses_cpu_builds_and_missing_devices():
    with pytest.raises(SignalUnavailable, match="CUDA is not available") as err:
        CudaSignal(0, torch=SimpleNamespace(cuda=FakeCuda(devices=0)))
    assert err.value.exit_code == 3
    with pytest.raises(SignalUnavailable, match="device 5 does not exist"):
        CudaSignal(5, torch=SimpleNamespace(cuda=FakeCuda()))


def test_cuda_signal_for_real_torch_on_this_machine():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        r = CudaSignal(0).read()
        assert r.ok and 0 < r.used <= r.limit
    else:
        with pytest.raises(SignalUnavailable, match="is_available"):
            CudaSignal(0)


class FakeNvml:
    def __init__(self, totals=(80 << 30, 40 << 30), lost=()):
        self.totals, self.lost, self.inits = totals, set(lost), 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetCount(self):
        return len(self.totals)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        if h in self.lost:
            raise RuntimeError("NVMLError_GpuIsLost")
        return SimpleNamespace(total=self.totals[h], used=self.totals[h] // 4, free=self.totals[h] * 3 // 4)


def test_nvml_signal_and_device_memory_against_a_fake():
    nvml = FakeNvml()
    r = NvmlSignal(1, nvml=nvml).read()
    assert (r.signal, r.used, r.limit, r.source) == ("nvml:1", 10 << 30, 40 << 30, "nvml")
    assert device_memory(nvml) == [80 << 30, 40 << 30]
    nvml.lost.add(1)
    assert "GpuIsLost" in NvmlSignal(1, nvml=nvml).read().error
    with pytest.raises(SignalUnavailable, match="GPU 2 does not exist"):
        NvmlSignal(2, nvml=nvml)


def test_nvml_absent_for_real_is_one_line_with_the_fix():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception:
        pass
    else:
        pytest.skip("NVML works here (a GPU machine)")
    with pytest.raises(SignalUnavailable, match=r"NVML is not available .*; fix:") as err:
        NvmlSignal(0)
    assert "\n" not in str(err.value) and err.value.exit_code == 3


def test_pool_signal_counts_referenced_and_cached_blocks():
    pool = PagedKVPool(64, 16)
    pool.open("a", "t")
    pool.append("a", list(range(100)))  # 7 blocks, 6 full ones cached
    r = PoolSignal(pool).read()
    assert (r.used, r.limit, r.unit) == (7, 64, "blocks")
    pool.free("a")
    r = PoolSignal(pool).read()
    assert r.used == 6 and r.extra == {"referenced": 0, "cached": 6}  # the prefix cache still holds 6
    pool.evict_cached()
    assert PoolSignal(pool).read().used == 0


def test_ledger_budget_signal_counts_every_tracked_byte():
    led = Ledger()
    led.add_entry(("p", 1), kind="block", nbytes=3 * MIB, request=None, source="test")
    r = LedgerBudgetSignal(led, 4 * MIB, source="KVG_KV_BUDGET_MB").read()
    assert (r.used, r.limit, r.ratio) == (3 * MIB, 4 * MIB, 0.75) and "KVG_KV_BUDGET_MB" in r.source
    with pytest.raises(UsageError, match="positive"):
        LedgerBudgetSignal(led, 0)


def test_budget_sources_in_order_and_the_article_alias():
    assert kv_budget(env={}) is None
    assert kv_budget(env={"NV_GPU_KV_CACHE_MB": "2048"}) == (2048 * MIB, "NV_GPU_KV_CACHE_MB")
    assert kv_budget(env={"NV_GPU_KV_CACHE_MB": "2048", "KVG_KV_BUDGET_MB": "1024"}).source == "KVG_KV_BUDGET_MB"
    assert kv_budget(512, env={"KVG_KV_BUDGET_MB": "1024"}).nbytes == 512 * MIB


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"env": {"KVG_KV_BUDGET_MB": "0"}}, "admits nothing"),
    ({"env": {"NV_GPU_KV_CACHE_MB": "-5"}}, "admits nothing"),
    ({"env": {"KVG_KV_BUDGET_MB": "2GiB"}}, "not a whole number"),
    ({"mb": 4096, "env": {}, "device_bytes": 1024 * MIB}, "larger than the device"),
])
def test_bad_budgets_are_one_line_with_the_fix(kwargs, message):
    with pytest.raises(UsageError, match=message) as err:
        kv_budget(**kwargs)
    assert "fix:" in str(err.value) and err.value.exit_code == 2
