"""Custom torch models: moved to `kvguardian.runtime.sources.custom` (this name stays importable)."""

from kvguardian.runtime.sources.custom import DEFAULT_BUFFER_PATTERN, ModuleTracker, find_kv_buffers

__all__ = ["DEFAULT_BUFFER_PATTERN", "ModuleTracker", "find_kv_buffers"]
