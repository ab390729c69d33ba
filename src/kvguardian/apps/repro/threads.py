"""Run a reproduction's tiny model single-threaded: PyTorch's intra-op threads only cost time on matrices
this small, and under CPU contention they make a decode many times slower (docs/design/repro.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["torch_threads"]


@contextlib.contextmanager
def torch_threads(n: int = 1) -> Iterator[None]:
    """Set ``torch.set_num_threads(n)`` for the block; restore the previous count after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
