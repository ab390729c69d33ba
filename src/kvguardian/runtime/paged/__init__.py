"""The paged KV block pool with ownership, a tenant-salted prefix cache, checks, metrics and a mini engine.

``import kvguardian.runtime.paged`` needs numpy only; torch loads when a pool with K/V tensors (``kv=KVSpec(...)``)
or the engine is built.
"""

from __future__ import annotations

from kvguardian.runtime.paged.block_pool import BlockPool, PoolExhausted
from kvguardian.runtime.paged.debug import PoolFault
from kvguardian.runtime.paged.metrics import METRIC_KEYS
from kvguardian.runtime.paged.pool import PagedKVPool
from kvguardian.runtime.paged.prefix import KVEvent, namespace_for
from kvguardian.runtime.paged.records import BlockTable, KVSpec, TableState

__all__ = [
    "METRIC_KEYS",
    "BlockPool",
    "BlockTable",
    "KVEvent",
    "KVSpec",
    "PagedKVPool",
    "PoolExhausted",
    "PoolFault",
    "TableState",
    "namespace_for",
]
