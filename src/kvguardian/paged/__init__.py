"""The paged KV block pool with ownership, a tenant-salted prefix cache, checks, metrics and a mini engine.

``import kvguardian.paged`` needs numpy only; torch loads when a pool with K/V tensors (``kv=KVSpec(...)``)
or the engine is built.
"""

from __future__ import annotations

from kvguardian.paged.block_pool import BlockPool, PoolExhausted
from kvguardian.paged.debug import PoolFault
from kvguardian.paged.metrics import METRIC_KEYS
from kvguardian.paged.pool import PagedKVPool
from kvguardian.paged.prefix import KVEvent, namespace_for
from kvguardian.paged.records import BlockTable, KVSpec, TableState

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
