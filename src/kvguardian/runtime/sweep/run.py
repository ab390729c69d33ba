"""The sweep: call an attention target at every length and check that memory returns to its baseline.

Per target and length: a warm-up call (its last rows checked against float64), a baseline, then ``repeats``
calls on fresh inputs, reading the ledger (a storage alive is proof, with its holder chain), the C allocator
and CUDA. A row is a LEAK when a storage outlived the call or memory grew after every repeat; memory that rose
once is ``one-time``. Garbage is collected before a LEAK verdict. Details: docs/design/sweep.md.
"""

from __future__ import annotations

import gc
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kvguardian.core.findings import Report
from kvguardian.core.ledger import EntrySite
from kvguardian.runtime.sweep.lengths import length_kind
from kvguardian.runtime.sweep.memory import CudaProbe, MallocProbe
from kvguardian.runtime.sweep.targets import BadOutput, Target

if TYPE_CHECKING:
    import torch

    from kvguardian.runtime.guard import Guard

__all__ = ["Row", "SweepConfig", "SweepResult", "run_sweep"]

REF_ROWS = 128  # query rows checked against the float64 reference (covers a partial block of up to 128)


@dataclass
class SweepConfig:
    batch: int = 1
    heads: int = 4
    head_dim: int = 64
    dtype: str = "float32"
    device: str = "cpu"
    repeats: int = 3
    tolerance: int = 64 * 1024  # bytes: allocator noise allowed between baseline and after a call
    check_output: bool = True
    seed: int = 0


@dataclass
class Row:
    """One (target, length) measurement."""

    target: str
    length: int
    kind: str  # "2^10-1", "2^10", "2^10+1", "other"
    ms: float  # median call time
    kv_bytes: int  # bytes of the K and V one call receives
    alive_bytes: list[int]  # storage bytes of received/returned tensors still alive after each repeat (ledger)
    malloc_delta: list[int] | None  # C allocator in-use bytes minus baseline, after each repeat
    cuda_allocated_delta: list[int] | None
    cuda_reserved_delta: list[int] | None
    cuda_driver_delta: list[int] | None
    cuda_peak_bytes: int | None  # peak allocated during the repeats
    max_abs_err: float | None  # last REF_ROWS query rows against float64
    verdict: str = "ok"  # "ok", "one-time", "LEAK", "WRONG", "ERROR" (the callable raised or returned bad output)
    reasons: list[str] = field(default_factory=list)
    holder_chain: list[str] | None = None

    def growth_per_call(self) -> int | None:
        """Allocated bytes added per repeat (least squares over the repeats; the allocator the device uses)."""
        series = self.cuda_allocated_delta if self.cuda_allocated_delta is not None else self.malloc_delta
        if not series:
            return None
        if len(series) == 1:
            return series[0]
        n = len(series)
        xm = (n - 1) / 2
        ym = sum(series) / n
        num = sum((i - xm) * (y - ym) for i, y in enumerate(series))
        den = sum((i - xm) ** 2 for i in range(n))
        return round(num / den)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["growth_per_call"] = self.growth_per_call()
        return d


@dataclass
class SweepResult:
    config: SweepConfig
    targets: list[str]
    lengths: list[int]
    rows: list[Row]
    notes: list[str]
    report: Report
    probes: dict[str, str]  # probe name -> "ok" or why it is unavailable
    seconds: float

    def bad_rows(self) -> list[Row]:
        return [r for r in self.rows if r.verdict in ("LEAK", "WRONG", "ERROR")]

    @property
    def ok(self) -> bool:
        return not self.bad_rows()

    def verdict(self) -> str:
        bad = self.bad_rows()
        n = len(self.lengths)
        if not bad:
            onetime = sum(1 for r in self.rows if r.verdict == "one-time")
            extra = f"; {onetime} row(s) rose once and stayed flat (a cache, not a leak)" if onetime else ""
            return (
                f"PASS: memory returned to baseline after every call: {n} lengths × {len(self.targets)} target(s), "
                f"{self.config.repeats} calls each{extra}"
            )
        parts = []
        for t in self.targets:
            rows = [r for r in bad if r.target == t]
            if rows:
                lens = [r.length for r in rows]
                shown = ", ".join(map(str, lens[:12])) + (" …" if len(lens) > 12 else "")
                kinds = "/".join(sorted({r.verdict for r in rows}))
                parts.append(f"{t}: {kinds} at {len(lens)} of {n} lengths ({shown})")
        return "FAIL: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "targets": self.targets,
            "lengths": self.lengths,
            "probes": self.probes,
            "notes": self.notes,
            "ok": self.ok,
            "verdict": self.verdict(),
            "rows": [r.to_dict() for r in self.rows],
            "findings": self.report.to_dict()["findings"],
            "seconds": round(self.seconds, 3),
        }


def _tail_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> float:
    """Max |out - reference| over the last REF_ROWS query rows, causal, reference in float64 on the CPU."""
    import torch

    s = q.shape[2]
    r0 = max(0, s - REF_ROWS)
    qd, kd, vd = (t.detach().to("cpu", torch.float64) for t in (q[:, :, r0:], k, v))
    scores = qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, H, rows, S]
    rows = torch.arange(r0, s).unsqueeze(1)
    cols = torch.arange(s).unsqueeze(0)
    scores.masked_fill_(cols > rows, float("-inf"))
    ref = torch.softmax(scores, dim=-1) @ vd
    got = out[:, :, r0:].detach().to("cpu", torch.float64)
    return float((got - ref).abs().max())


def _err_tolerance(dtype: str) -> float:
    return 1e-4 if dtype in ("float32", "float64") else 3e-2


def run_sweep(
    targets: list[Target],
    lengths: list[int],
    config: SweepConfig,
    *,
    notes: list[str] | None = None,
    progress: Callable[[str], object] | None = None,
) -> SweepResult:
    """Sweep every target over every length (see the module docstring). ``progress(text)`` is called per target."""
    import torch

    from kvguardian.runtime.guard import Guard

    t_start = time.perf_counter()
    device = torch.device(config.device)
    dtype = getattr(torch, config.dtype)
    malloc = MallocProbe()
    cuda = CudaProbe(device)
    guard = Guard()
    gen = torch.Generator(device="cpu").manual_seed(config.seed)
    elem = torch.tensor([], dtype=dtype).element_size()
    rows: list[Row] = []

    def make(n: int) -> list[Any]:
        shape = (config.batch, config.heads, n, config.head_dim)
        return [torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype) for _ in range(3)]

    bench = _Bench(config, guard, make, malloc, cuda, elem, device)
    gc.collect()  # unrelated garbage collected now, not in the middle of a measurement
    gc_was_enabled = gc.isenabled()
    for target in targets:
        if progress is not None:
            progress(f"sweeping {target.name} over {len(lengths)} lengths")
        for n in lengths:
            gc.disable()  # no automatic collection of unrelated garbage between baseline and readings (timeit does so)
            try:
                rows.append(_measure_length(bench, target, n))
            except Exception as exc:  # a failing kernel is what a sweep is for: this length is an ERROR row
                rows.append(_error_row(target, n, config, elem, exc))
            finally:
                if gc_was_enabled:
                    gc.enable()
    report = Report()
    if any(r.verdict == "LEAK" and any(r.alive_bytes) for r in rows):
        report = guard.check()
        chains = {f.evidence.get("request_id"): f.holder_chain for f in report.by_id("KVG102")}
        for row in rows:
            for rid, chain in chains.items():
                if chain and isinstance(rid, str) and rid.startswith(f"{row.target}/len={row.length}/"):
                    row.holder_chain = chain
                    break
    probes = {
        "ledger": "ok",
        "malloc": "ok" if malloc.available else malloc.why,
        "cuda": "ok" if cuda.available else cuda.why,
    }
    return SweepResult(config, [t.name for t in targets], list(lengths), rows, list(notes or []), report, probes,
                       time.perf_counter() - t_start)



def _error_row(target: Target, n: int, config: SweepConfig, elem: int, exc: Exception) -> Row:
    """The row of a length where the callable raised or returned a bad output; the sweep goes on."""
    what = str(exc) if isinstance(exc, BadOutput) else f"the callable raised {type(exc).__name__}: {exc}"
    return Row(target=target.name, length=n, kind=length_kind(n), ms=0.0,
               kv_bytes=2 * config.batch * config.heads * n * config.head_dim * elem, alive_bytes=[],
               malloc_delta=None, cuda_allocated_delta=None, cuda_reserved_delta=None, cuda_driver_delta=None,
               cuda_peak_bytes=None, max_abs_err=None, verdict="ERROR", reasons=[what.splitlines()[0][:300]])


def _check_output(out: object, q: torch.Tensor) -> None:
    import torch

    if not isinstance(out, torch.Tensor):
        raise BadOutput(f"the callable returned {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(q.shape):
        raise BadOutput(f"the callable returned shape {tuple(out.shape)}, expected {tuple(q.shape)} (as q)")


@dataclass(frozen=True)
class _Bench:
    """What every length of one sweep measures with: the settings, the guard, the inputs' maker, the probes."""

    config: SweepConfig
    guard: Guard
    make: Callable[[int], list[Any]]  # n -> [q, k, v]
    malloc: MallocProbe
    cuda: CudaProbe
    elem: int  # bytes per element of the swept dtype
    device: Any

    def read(self) -> tuple[int | None, dict[str, int] | None]:
        return self.malloc.read(), self.cuda.read()


def _measure_length(bench: _Bench, target: Target, n: int) -> Row:
    """Warm up, read the baseline, run ``config.repeats`` calls and read after each; judge the row."""
    import torch

    config, guard, make, read, cuda, elem, device = (bench.config, bench.guard, bench.make, bench.read,
                                                     bench.cuda, bench.elem, bench.device)

    q, k, v = make(n)
    out, received = target(q, k, v)  # warm-up; its output is the one checked against the reference, so the
    # reference's own allocations (BLAS keeps float64 GEMM buffers) happen before the baseline is read
    _check_output(out, q)
    err = _tail_error(q, k, v, out) if config.check_output else None
    del q, k, v, out, received
    base_m, base_c = read()
    alive: list[int] = []
    m_delta: list[int] = []
    c_alloc: list[int] = []
    c_res: list[int] = []
    c_drv: list[int] = []
    times: list[float] = []
    tracked: dict[int, int] = {}  # storage key -> bytes
    cuda.reset_peak()
    for r in range(config.repeats):
        q, k, v = make(n)
        with guard.request(f"{target.name}/len={n}/call={r}"):
            t0 = time.perf_counter()
            out, received = target(q, k, v)
            _check_output(out, q)
            if cuda.available:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
            _track(guard, target.name, [*received, out], tracked)
        del q, k, v, out, received
        alive.append(_alive_bytes(guard, tracked))
        mm, cc = read()
        if mm is not None and base_m is not None:
            m_delta.append(mm - base_m)
        if cc is not None and base_c is not None:
            c_alloc.append(cc["allocated"] - base_c["allocated"])
            c_res.append(cc["reserved"] - base_c["reserved"])
            c_drv.append(cc["driver_used"] - base_c["driver_used"])
    row = Row(
        target=target.name, length=n, kind=length_kind(n), ms=sorted(times)[len(times) // 2] * 1e3,
        kv_bytes=2 * config.batch * config.heads * n * config.head_dim * elem,
        alive_bytes=alive,
        malloc_delta=m_delta if base_m is not None else None,
        cuda_allocated_delta=c_alloc if base_c is not None else None,
        cuda_reserved_delta=c_res if base_c is not None else None,
        cuda_driver_delta=c_drv if base_c is not None else None,
        cuda_peak_bytes=cuda.peak(),
        max_abs_err=err,
    )
    _judge(row, bench, tracked, base_m, base_c)
    return row


def _track(guard: Guard, source: str, tensors: list[torch.Tensor], tracked: dict[int, int]) -> None:
    """Record q, k, v (as received) and the output in the ledger; remember their storages' keys and bytes.

    A function of its own so no loop variable outlives the call and keeps a tensor alive.
    """
    req = guard.current_request()
    for kind, t in zip(("q", "k", "v", "o"), tensors):
        guard.ledger.observe(t, EntrySite(kind, 0, source), req)
        tracked[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()


def _alive_bytes(guard: Guard, tracked: dict[int, int]) -> int:
    live = {r.key for r in guard.ledger.records()}
    return sum(b for key, b in tracked.items() if key in live)


def _growing(series: list[int] | None, tol: int) -> bool:
    """Above the tolerance after every call, and at least half a tolerance more after each call than before."""
    return bool(series) and all(d > tol for d in series) and all(  # type: ignore[union-attr]
        b - a >= tol / 2 for a, b in itertools.pairwise(series)  # type: ignore[arg-type]
    )


def _judge(row: Row, bench: _Bench, tracked: dict[int, int], base_m: int | None,
           base_c: dict[str, int] | None) -> None:
    """Set the row's verdict and reasons; re-read after collecting the calls' garbage before calling a leak."""
    config, guard, malloc, cuda = bench.config, bench.guard, bench.malloc, bench.cuda
    tol = config.tolerance
    on_cuda = row.cuda_allocated_delta is not None
    series = row.cuda_allocated_delta if on_cuda else row.malloc_delta
    if any(row.alive_bytes) or _growing(series, tol):
        # Automatic collection was off since the warm-up, so everything the calls created is in generation 0:
        # collecting it frees any cyclic garbage they left, at a fraction of a full collection's cost.
        gc.collect(0)
        row.alive_bytes[-1] = _alive_bytes(guard, tracked)
        if on_cuda:
            cc = cuda.read()
            if cc is not None and base_c is not None and row.cuda_allocated_delta:
                row.cuda_allocated_delta[-1] = cc["allocated"] - base_c["allocated"]
        else:
            mm = malloc.read()
            if mm is not None and base_m is not None and row.malloc_delta:
                row.malloc_delta[-1] = mm - base_m
    growing = _growing(series, tol)
    if row.alive_bytes[-1]:
        row.verdict = "LEAK"
        row.reasons.append(
            f"{row.alive_bytes[-1]} bytes of the storages the callable received or returned are still alive "
            f"after {config.repeats} calls and gc"
        )
    if growing and series:
        row.verdict = "LEAK"
        which = "CUDA allocated" if on_cuda else "C allocator in-use"
        row.reasons.append(f"{which} bytes grew after every call: {series} (tolerance {tol})")
    elif series and series[-1] > tol and row.verdict == "ok":
        row.verdict = "one-time"
        row.reasons.append(f"memory rose once and stayed: {series}")
    if row.max_abs_err is not None and not row.max_abs_err <= _err_tolerance(config.dtype):
        row.verdict = "WRONG" if row.verdict in ("ok", "one-time") else row.verdict
        row.reasons.append(f"output differs from the float64 reference by {row.max_abs_err:.3g} in the last rows")
