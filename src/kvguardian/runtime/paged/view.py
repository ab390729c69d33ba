"""What the pool's readers see of it: the audit, the metrics and the debug checker read a pool through
`PoolView`, so they sit below `kvguardian.runtime.paged.pool` (which builds them) and import nothing above them.

`PoolObserver` is the other direction: the calls a pool makes into an observer of its operations (the debug
checker, `kvguardian.runtime.paged.debug`). The pool never touches an observer's state; it only reports what it did.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

    from kvguardian.runtime.paged.block_pool import BlockPool
    from kvguardian.runtime.paged.prefix import EventStream
    from kvguardian.runtime.paged.records import BlockTable

__all__ = ["PoolObserver", "PoolView"]


class PoolView(Protocol):
    """The read side of `PagedKVPool` that its audit, metrics and checks use."""

    blocks: BlockPool
    num_blocks: int
    block_size: int
    block_bytes: int
    filled: np.ndarray  # token slots assigned in each block
    ns_of: np.ndarray  # namespace code of each block's content (-1: none)
    op_seq: int
    prefix_queries: int
    prefix_hits: int
    preemptions: int
    cow_copies: int
    closed_forgotten: int
    faults_count: Counter[str]
    events: EventStream

    def tables(self) -> list[BlockTable]: ...

    def closed_tables(self) -> list[BlockTable]: ...

    def namespace_name(self, code: int) -> str: ...


class PoolObserver(Protocol):
    """Told of every pool operation as it happens (`PagedKVPool(debug=True)` attaches the checker)."""

    def begin(self, op: str, table: BlockTable | None, layer: int | None) -> None: ...

    def end(self, touched: np.ndarray) -> None: ...

    def on_open(self, table: BlockTable) -> None: ...

    def on_table_add(self, table: BlockTable, ids: np.ndarray) -> None: ...

    def on_table_remove(self, table: BlockTable, ids: np.ndarray) -> None: ...

    def pre_share(self, t: BlockTable, ids: np.ndarray, *, parent: BlockTable | None = None) -> None: ...

    def pre_release(self, t: BlockTable, ids: np.ndarray, *, held: bool = False) -> None: ...

    def pre_close(self, t: BlockTable) -> None: ...

    def assign_slots(self, t: BlockTable, slots: np.ndarray) -> None: ...

    def check_write(self, t: BlockTable | None, request_id: str, slots: torch.Tensor | np.ndarray,
                    layer: int) -> None: ...
