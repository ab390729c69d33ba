"""What the mini server is built from (`MiniConfig`): a module of its own, light to import, so that
``kv-guardian serve-mini`` takes its options' types and defaults from these fields without loading FastAPI."""

from __future__ import annotations

from dataclasses import dataclass

from kvguardian.apps.mini_server.tenancy import CACHE_MODES
from kvguardian.core.errors import UsageError

__all__ = ["MiniConfig"]


@dataclass(frozen=True)
class MiniConfig:
    """Everything the mini server is built from."""

    model_name: str = "kvg-mini"
    cache_mode: str = "per-tenant"
    api_keys: tuple[str, ...] = ()  # TENANT=KEY
    keys_files: tuple[str, ...] = ()
    num_blocks: int = 2048
    block_size: int = 16
    max_model_len: int = 4096
    max_num_seqs: int = 8
    max_batch_tokens: int = 2048
    hidden: int = 64  # the per-token prefill cost grows with these
    layers: int = 2
    seed: int = 0
    threads: int = 1
    debug: bool = False  # the pool's incremental checks (KVG2xx findings in /metrics)
    scrub: str = "never"  # KV remanence: never / on-tenant-change / always

    def validate(self) -> None:
        if self.cache_mode not in CACHE_MODES:
            raise UsageError(f"cache mode {self.cache_mode!r} is not one of {', '.join(CACHE_MODES)}")
        for name in ("num_blocks", "block_size", "max_model_len", "max_num_seqs", "max_batch_tokens", "hidden",
                     "layers", "threads"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.hidden % 4:
            raise UsageError(f"hidden must be a multiple of 4 (4 heads), got {self.hidden}")
