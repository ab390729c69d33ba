"""Attention callables the sweep can run, and how it calls each one.

A target is an attention function plus a layout (``bhsd``: SDPA's signature, ``bshd``: ``flash_attn_func``,
``varlen``: ``flash_attn_varlen_func``). Specs (``--attn``): ``sdpa`` (every backend of the device, or
``sdpa-math``...), ``paged``, ``flash-attn`` (CUDA) and ``module:function``. The layouts and specs in detail:
docs/design/sweep.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError

if TYPE_CHECKING:
    import torch

__all__ = ["LAYOUTS", "SDPA_BACKENDS", "BadOutput", "Target", "resolve_targets"]

LAYOUTS = ("bhsd", "bshd", "varlen")
#: spec suffix -> torch.nn.attention.SDPBackend member
SDPA_BACKENDS = {
    "math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
}


@dataclass
class Target:
    """One attention callable and its calling convention."""

    name: str  # shown in the table: "sdpa-flash", "flash_attn:flash_attn_varlen_func"
    fn: Callable[..., Any]
    layout: str  # one of LAYOUTS
    causal_kw: str  # keyword that turns on the causal mask: "is_causal" or "causal"
    context: Callable[[], Any] | None = None  # entered around every call (an SDPA backend pin)

    def prepare(self, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any], list[Any]]:
        """Turn ``[B, H, S, D]`` tensors into this target's arguments; also return the q, k, v it receives."""
        kw = {self.causal_kw: True}
        if self.layout == "bhsd":
            return (q, k, v), kw, [q, k, v]
        if self.layout == "bshd":
            q2, k2, v2 = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            return (q2, k2, v2), kw, [q2, k2, v2]
        # varlen: the batch packed along the token axis, sequences delimited by cumulative offsets
        import torch

        b, h, s, d = q.shape
        q2, k2, v2 = (t.transpose(1, 2).reshape(b * s, h, d).contiguous() for t in (q, k, v))
        cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=q.device)
        return (q2, k2, v2, cu, cu, s, s), kw, [q2, k2, v2]

    def finish(self, out: Any, shape: tuple[int, ...]) -> Any:
        """The callable's output back as ``[B, H, S, D]`` (flash-attn may return a tuple: take the first)."""
        if isinstance(out, (tuple, list)) and out:
            out = out[0]
        if not hasattr(out, "shape") or len(out.shape) not in (3, 4):
            raise BadOutput(f"the callable returned {type(out).__name__}, not an attention output tensor")
        b, h, s, d = shape
        if self.layout == "bshd":
            return out.transpose(1, 2)
        if self.layout == "varlen":
            return out.reshape(b, s, h, d).transpose(1, 2)
        return out

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[Any, list[Any]]:
        """Run once; return the output as ``[B, H, S, D]`` and the ``[q, k, v]`` the callable received."""
        args, kw, received = self.prepare(q, k, v)
        if self.context is not None:
            with self.context():
                out = self.fn(*args, **kw)
        else:
            out = self.fn(*args, **kw)
        return self.finish(out, tuple(q.shape)), received


class BadOutput(ValueError):
    """The callable returned something that is not attention's output for the call (the row is an ERROR)."""


def _sdpa(backend: str) -> Target:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    member = getattr(SDPBackend, SDPA_BACKENDS[backend])
    return Target(f"sdpa-{backend}", F.scaled_dot_product_attention, "bhsd", "is_causal",
                  context=lambda: sdpa_kernel(member))


def _works(target: Target, device: torch.device, dtype: torch.dtype) -> str | None:
    """None when ``target`` runs a tiny causal call on ``device``; else why not (one line)."""
    import torch

    q = torch.randn(1, 2, 5, 64, device=device, dtype=dtype)
    try:
        target(q, q.clone(), q.clone())
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else ""
        return f"{type(exc).__name__}: {text.split('. ')[0][:160]}"
    return None


def _import_spec(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(
            f"--attn {spec!r} is not 'module:function'; fix: e.g. --attn flash_attn:flash_attn_varlen_func"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"--attn {spec!r}: module {module_name!r} cannot be imported ({exc}); fix: install it, or check the spec",
            exit_code=EXIT_ENVIRONMENT,
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"--attn {spec!r}: {module_name} has no attribute {attr!r}; fix: check the name") from None
    if not callable(obj):
        raise UsageError(f"--attn {spec!r} is a {type(obj).__name__}, not a callable; fix: name a function")
    return obj  # type: ignore[no-any-return]


def paged_attention() -> Callable[..., Any] | None:
    """The paged pool's attention when `kvguardian.runtime.paged` is installed: its own ``sweep_attention`` if it has
    one, else this package's adapter (`kvguardian.runtime.sweep.paged`); None without the pool."""
    try:
        mod = importlib.import_module("kvguardian.runtime.paged")
    except ImportError:
        return None
    fn = getattr(mod, "sweep_attention", None)
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    from kvguardian.runtime.sweep import paged

    return paged.paged_attention if paged.available() else None


def resolve_targets(
    specs: list[str], *, device: torch.device, dtype: torch.dtype, layout: str = "bhsd", causal_kw: str | None = None
) -> tuple[list[Target], list[str]]:
    """Build the targets named by ``specs``; return them and notes on what was skipped and why.

    ``sdpa`` expands to every backend that works on ``device`` (a backend that does not is a note, not an
    error); a backend named alone that does not work is an error.

    Raises:
        UsageError: a bad spec or layout, a module that cannot be imported, a callable that fails a tiny call.
    """
    if layout not in LAYOUTS:
        raise UsageError(f"--layout {layout!r} is unknown; fix: use one of {', '.join(LAYOUTS)}")
    targets: list[Target] = []
    notes: list[str] = []
    for spec in specs:
        if spec == "sdpa":
            for backend in SDPA_BACKENDS:
                t = _sdpa(backend)
                why = _works(t, device, dtype)
                if why is None:
                    targets.append(t)
                else:
                    notes.append(f"{t.name} skipped on {device}: not available ({why})")
            paged = paged_attention()
            if paged is not None:
                targets.append(Target("paged", paged, "bhsd", "is_causal"))
            else:
                notes.append("paged skipped: kvguardian.runtime.paged (the paged KV pool) is not installed")
            continue
        if spec.startswith("sdpa-") and spec[5:] in SDPA_BACKENDS:
            t = _sdpa(spec[5:])
        elif spec == "paged":
            fn = paged_attention()
            if fn is None:
                raise UsageError(
                    "--attn paged: kvguardian.runtime.paged (the paged KV pool) is not installed in this kv-guardian; "
                    "fix: install a kv-guardian with the paged pool, or pass --attn module:function",
                    exit_code=EXIT_ENVIRONMENT,
                )
            t = Target("paged", fn, "bhsd", "is_causal")
        elif spec == "flash-attn":
            t = Target("flash_attn:flash_attn_varlen_func", _import_spec("flash_attn:flash_attn_varlen_func"),
                       "varlen", "causal")
        elif ":" in spec:
            kw = causal_kw or ("is_causal" if layout == "bhsd" else "causal")
            t = Target(spec, _import_spec(spec), layout, kw)
        else:
            raise UsageError(
                f"--attn {spec!r} is unknown; fix: use sdpa, sdpa-math, sdpa-flash, sdpa-efficient, sdpa-cudnn, "
                "paged, flash-attn, or module:function"
            )
        why = _works(t, device, dtype)
        if why is not None:
            raise UsageError(
                f"--attn {spec!r} failed a 5-token causal call on {device} in {str(dtype).replace('torch.', '')} "
                f"with the {t.layout} layout ({why}); fix: check --layout, --device and --dtype",
                exit_code=None if ":" in spec else EXIT_ENVIRONMENT,  # a named backend: missing here
            )
        targets.append(t)
    return targets, notes
