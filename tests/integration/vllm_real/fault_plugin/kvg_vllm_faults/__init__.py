"""Faults injected into real vLLM 0.32 for kv-guardian's tests (never for production).

``KVG_VLLM_FAULTS`` is a comma list of:

- ``lost_free_on_abort``: ``KVCacheManager.free`` does nothing for an aborted request, so its blocks stay
  referenced after the request is gone - the lost free of vLLM issue #46283 (aborted transfers) in spirit.
- ``ignore_salt``: the prefix hash leaves out ``cache_salt``, so requests of different salts share prefix
  blocks - the cross-tenant reuse that ``cache_salt`` exists to prevent (CVE-2025-46570 class).

Patched only in the engine-core process (where vLLM calls the plugin from ``EngineCore.__init__``).
"""

from __future__ import annotations

import os
import sys

FAULTS = frozenset(f.strip() for f in os.environ.get("KVG_VLLM_FAULTS", "").split(",") if f.strip())
_done: set[str] = set()


def register() -> None:
    if not FAULTS or "vllm.v1.engine.core" not in sys.modules:
        return
    if "lost_free_on_abort" in FAULTS and "lost_free_on_abort" not in _done:
        _lost_free_on_abort()
    if "ignore_salt" in FAULTS and "ignore_salt" not in _done:
        _ignore_salt()
    sys.stderr.write(f"kvg-vllm-faults: injected {sorted(_done)} in pid {os.getpid()}\n")


def _lost_free_on_abort() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.request import RequestStatus

    free = KVCacheManager.free

    def leaky_free(self, request):  # type: ignore[no-untyped-def]
        if request.status == RequestStatus.FINISHED_ABORTED:
            return None  # the fault: the aborted request's blocks are never returned
        return free(self, request)

    KVCacheManager.free = leaky_free
    _done.add("lost_free_on_abort")


def _ignore_salt() -> None:
    from vllm.v1.core import kv_cache_utils

    keys = kv_cache_utils.generate_block_hash_extra_keys

    def without_salt(request, start, end, mm_idx):  # type: ignore[no-untyped-def]
        extra, nxt = keys(request, start, end, mm_idx)
        if extra:
            extra = tuple(k for k in extra if not (isinstance(k, tuple) and k and k[0] == "cache_salt")) or None
        return extra, nxt

    kv_cache_utils.generate_block_hash_extra_keys = without_salt
    _done.add("ignore_salt")
