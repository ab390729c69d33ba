"""Differences between transformers 5.x releases that kv-guardian has to know about.

==========  =============================================================================================
release     what changed for kv-guardian
==========  =============================================================================================
4.x         refused: the ``Cache``/``layers`` design starts in 5.0 (`check_transformers_version`)
5.0–5.4     ``Cache.update(k, v, layer_idx, cache_kwargs=None)``; static layers keep no fill counter (the
            update's ``cache_position`` tells it); ``StaticLayer.get_seq_length()`` scans the cache, so it is
            never called on the hot path
5.5         ``update(k, v, layer_idx, *args, **kwargs)``; static layers count tokens in
            ``cumulative_length`` (a tensor); linear-attention layers appear
5.21        ``QuantizedCache(backend="fp8")`` (``Fp8QuantizedLayer``, runs on CPU)
5.23        ``DummyLayer`` for layers without KV
5.24        ``past_key_values`` renamed ``cache`` (forward keeps the old name with a warning until 5.40,
            generate until 6.0); outputs have ``.cache``, ``.past_key_values`` still works
==========  =============================================================================================
"""

from __future__ import annotations

from typing import Any

from kvguardian._errors import UsageError

__all__ = [
    "MIN_TRANSFORMERS",
    "cache_kwarg",
    "check_transformers_version",
    "output_cache",
    "transformers_version",
    "version_tuple",
]

MIN_TRANSFORMERS = (5, 0)


def version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        out.append(int(digits) if digits else 0)
    return tuple(out)


def transformers_version() -> tuple[int, ...]:
    import transformers

    return version_tuple(transformers.__version__)


def check_transformers_version(version: str | None = None) -> str:
    """Return the transformers version, or raise `UsageError` (exit code 3) naming the minimum supported one."""
    if version is None:
        import transformers

        version = str(transformers.__version__)
    if version_tuple(version)[:2] < MIN_TRANSFORMERS:
        raise UsageError(
            f"transformers {version} is not supported; kv-guardian needs transformers >= "
            f"{'.'.join(map(str, MIN_TRANSFORMERS))}; fix: pip install 'transformers>=5,<6'",
            exit_code=3,
        )
    return version


def cache_kwarg() -> str:
    """The keyword a model's forward takes its cache by: ``cache`` from 5.24, ``past_key_values`` before."""
    return "cache" if transformers_version() >= (5, 24) else "past_key_values"


def output_cache(output: Any) -> Any:
    """The cache of a model output, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
