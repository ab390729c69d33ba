"""Differences between transformers 5.x releases that kv-guardian has to know about."""

from __future__ import annotations

from typing import Any

__all__ = ["cache_kwarg", "transformers_version", "version_tuple"]


def version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def transformers_version() -> tuple[int, ...]:
    import transformers

    return version_tuple(transformers.__version__)


def cache_kwarg() -> str:
    """The keyword a model's forward takes its cache by: ``cache`` from 5.24, ``past_key_values`` before."""
    return "cache" if transformers_version() >= (5, 24) else "past_key_values"


def output_cache(output: Any) -> Any:
    """The cache of a model output, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
