"""`sanitize`: a Triton kernel whose every KV-cache access is checked against block ownership.

    checked = sanitize(paged_decode_kernel, kv_caches=("k_cache", "v_cache"),
                       block_table="block_table", seq_lens="seq_lens", block_size="BLOCK_SIZE")
    checked[grid](q, k_cache, v_cache, block_table, seq_lens, out, ...)    # same arguments as the kernel
    checked.findings()      # KVG210 (read outside ownership) / KVG202 (write outside ownership)

The kernel is rewritten once before compilation (`kvguardian.triton.rewrite`); each launch adds a violation
buffer and the ownership tables as trailing arguments. The options: docs/design/triton.md.
"""

from __future__ import annotations

import inspect
import itertools
import linecache
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvguardian.core.findings import Finding, Severity
from kvguardian.triton.rewrite import CHECK_NAME, Rewritten, SanitizerError, Site, rewrite_kernel

if TYPE_CHECKING:
    import torch
    from triton.runtime.jit import JITFunction

    #: a launch grid, as Triton takes it: the programs per axis, or a function of the launch's meta-parameters
    Grid = tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...]]

__all__ = ["SanitizedKernel", "SanitizerError", "Violation", "sanitize"]

_COUNTER = itertools.count()
_REPORTS = 64  # launches with violations kept (bounded: the auditor must not become the leak)


@dataclass(frozen=True)
class Violation:
    """What one launch's buffer said: the count per site and the first violation in detail."""

    count: int
    per_site: dict[int, int]
    program: int  # linear program id of the first violation
    sequence: int
    block: int
    slot: int  # slot within the block
    owner: int  # sequence whose ownership row lists the block, -1 for none (free or unallocated)
    site: Site
    position: int  # token position in the sequence, -1 when the block is not the sequence's


def _python_fn(kernel: object) -> Callable[..., Any]:
    fn = getattr(kernel, "fn", kernel)
    while hasattr(fn, "fn"):
        fn = fn.fn
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise SanitizerError(f"{kernel!r} is not a @triton.jit kernel or a Python function; pass the kernel")
    return fn  # type: ignore[no-any-return]


def sanitize(kernel: object, *, kv_caches: Sequence[str], block_table: str | torch.Tensor,
             seq_lens: str | torch.Tensor, block_size: str | int,
             sequence: str = "tl.program_id(0)", slot_dim: int = 1) -> SanitizedKernel:
    """Return the kernel with a KV-ownership check after every KV-cache load and store.

    Raises:
        SanitizerError: the kernel's source is unavailable, or it has no access through ``kv_caches``.
    """
    import triton

    from kvguardian.triton.checks import kv_check

    fn = _python_fn(kernel)
    name = getattr(fn, "__qualname__", fn.__name__)
    caches = tuple(kv_caches)
    if not caches or not all(isinstance(c, str) for c in caches):
        raise SanitizerError(f"{name}: kv_caches must name the kernel's KV-cache pointer parameters, got {kv_caches!r}")
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise SanitizerError(f"{name}: its source is not available ({exc}); define the kernel in a file") from None
    filename = inspect.getsourcefile(fn) or "<kernel>"
    try:
        rw = rewrite_kernel("".join(lines), caches=caches, sequence=sequence, first_line=first,
                            module_globals=fn.__globals__, kernel_name=name)
    except SyntaxError as exc:
        raise SanitizerError(f"{name}: cannot parse its source or the sequence expression ({exc.msg})") from None
    for arg, what in ((block_table, "block_table"), (seq_lens, "seq_lens")):
        if isinstance(arg, str) and arg not in rw.params:
            raise SanitizerError(f"{name}: {what}={arg!r} is not a parameter of the kernel ({', '.join(rw.params)})")
    fake = f"<kvguardian-sanitized {name} #{next(_COUNTER)}>"
    linecache.cache[fake] = (len(rw.source), None, rw.source.splitlines(True), fake)
    namespace = dict(fn.__globals__)
    namespace[CHECK_NAME] = kv_check
    exec(compile(rw.source, fake, "exec"), namespace)  # our own rewrite of the user's kernel
    jitted = triton.jit(namespace[rw.name])
    return SanitizedKernel(jitted, rw, filename, caches, block_table, seq_lens, block_size, slot_dim)


class SanitizedKernel:
    """Launch like the kernel (``k[grid](*args, **kwargs)``); violations are read back after each launch."""

    def __init__(self, jitted: JITFunction, rw: Rewritten, filename: str, caches: tuple[str, ...],
                 block_table: str | torch.Tensor, seq_lens: str | torch.Tensor, block_size: str | int,
                 slot_dim: int) -> None:
        self.jitted = jitted
        self.rewritten = rw
        self.filename = filename
        self.caches = caches
        self.block_table = block_table
        self.seq_lens = seq_lens
        self.block_size = block_size
        self.slot_dim = slot_dim
        self.launches = 0
        self.violations: deque[Violation] = deque(maxlen=_REPORTS)
        self.sites = rw.sites

    def __getitem__(self, grid: Grid) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            return self.launch(grid, *args, **kwargs)

        return launch

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        params = self.rewritten.params
        if len(args) > len(params):
            raise SanitizerError(f"{self.rewritten.name}: {len(args)} positional arguments for "
                                 f"{len(params)} parameters")
        bound = dict(zip(params, args))
        bound.update(kwargs)
        return bound

    def _resolve(self, value: object, bound: dict[str, Any], what: str) -> Any:
        if isinstance(value, str):
            if value not in bound:
                raise SanitizerError(f"{self.rewritten.name}: the launch passes no {what} argument {value!r}")
            return bound[value]
        return value

    def launch(self, grid: Grid, *args: Any, **kwargs: Any) -> Any:
        import torch

        bound = self._bound(args, kwargs)
        bt = self._resolve(self.block_table, bound, "block_table")
        lens = self._resolve(self.seq_lens, bound, "seq_lens")
        bs = int(self._resolve(self.block_size, bound, "block_size"))
        device = bound[self.caches[0]].device
        buf = torch.zeros(16 + len(self.sites), dtype=torch.int64, device=device)
        extra: dict[str, Any] = {
            "_kvg_buf": buf, "_kvg_bt": bt, "_kvg_bt_stride": bt.stride(0), "_kvg_lens": lens,
            "_kvg_nseq": int(bt.shape[0]), "_KVG_BS": bs, "_KVG_MAXB": triton_next_pow2(int(bt.shape[1])),
        }
        for c in self.caches:
            t = bound[c]
            extra[f"_kvg_blk_{c}"] = t.stride(0) * t.element_size()
            extra[f"_kvg_slot_{c}"] = t.stride(self.slot_dim) * t.element_size()
        result = self.jitted[grid](**bound, **extra)
        self.launches += 1
        self._read(buf.tolist())
        return result

    def _read(self, b: list[int]) -> None:
        if b[0] == 0:
            return
        per_site = {i: b[16 + i] for i in range(len(self.sites)) if b[16 + i]}
        self.violations.append(Violation(b[0], per_site, b[2], b[3], b[4], b[5], b[6], self.sites[b[7]], b[8]))

    def take_violations(self) -> list[Violation]:
        out = list(self.violations)
        self.violations.clear()
        return out

    def findings(self) -> list[Finding]:
        """One finding per launch with violations: KVG210 for reads, KVG202 for writes, at the kernel's line."""
        return [_finding(v, self.filename, self.rewritten.name) for v in self.violations]


def _finding(v: Violation, filename: str, kernel: str) -> Finding:
    read = v.site.kind == "load"
    whose = "no request (free or never allocated)" if v.owner < 0 else (
        "its own" if v.owner == v.sequence else f"sequence {v.owner}")
    where = f"past its length (token {v.position})" if v.position >= 0 else f"in block {v.block}, owned by {whose}"
    message = (f"{kernel} at {filename}:{v.site.line}: program {v.program} (sequence {v.sequence}) "
               f"{'read' if read else 'wrote'} slot {v.slot} {where}; {v.count} element(s) outside ownership "
               f"in this launch")
    evidence = {"kernel": kernel, "file": filename, "line": v.site.line, "statement": v.site.text,
                "cache": v.site.cache, "program": v.program, "sequence": v.sequence, "block": v.block,
                "slot": v.slot, "owner": v.owner, "position": v.position, "count": v.count,
                "per_site": {str(k): n for k, n in v.per_site.items()}}
    return Finding("KVG210" if read else "KVG202", Severity.ERROR, message, evidence)


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())
