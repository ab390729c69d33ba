"""Triton KV-ownership sanitizer (article §4.2) and a paged decode-attention kernel: ``kv-guardian[triton]``.

`sanitize` rewrites a ``@triton.jit`` kernel's Python AST before compilation so that every load and store
through a KV-cache pointer is followed by an ownership check written in Triton (`checks`): the slot must be
in a block of the current sequence's block-table row, and below its length for reads. Violations land in a
small device buffer read back after the launch, so the same code works with ``TRITON_INTERPRET=1`` on a CPU
and compiled on a GPU. Importing this package needs nothing; `sanitize` and the kernel import Triton.
"""

from __future__ import annotations

from typing import Any

from kvguardian.triton.rewrite import SanitizerError

__all__ = ["SanitizerError", "paged_decode", "sanitize"]


def sanitize(kernel: object, **kwargs: Any) -> Any:
    """See `kvguardian.triton.sanitizer.sanitize`."""
    from kvguardian.core.errors import require

    require("triton", "triton")
    from kvguardian.triton.sanitizer import sanitize as _sanitize

    return _sanitize(kernel, **kwargs)


def paged_decode(*args: Any, **kwargs: Any) -> Any:
    """See `kvguardian.triton.paged_attention.paged_decode`."""
    from kvguardian.core.errors import require

    require("triton", "triton")
    from kvguardian.triton.paged_attention import paged_decode as _paged_decode

    return _paged_decode(*args, **kwargs)
