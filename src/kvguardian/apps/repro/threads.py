"""Run a reproduction's tiny model single-threaded: PyTorch's intra-op threads only cost time on matrices
this small, and under CPU contention (a shared 2-core machine) they cost 10-20× (measured: a 4-token decode
of the tiny Llama took 0.39-0.80 s with 2 threads and 0.03-0.05 s with 1 while other work ran)."""

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
