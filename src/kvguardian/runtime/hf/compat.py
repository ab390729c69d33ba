"""Differences between transformers 5.x releases that kv-guardian has to know about.

4.x is refused (the ``Cache``/``layers`` design starts in 5.0); ``Cache.update``'s signature changed in 5.5;
static layers count their tokens from 5.5 on (before, the update's ``cache_position`` tells it); fp8 quantized
caches arrive in 5.21, ``DummyLayer`` in 5.23, and ``past_key_values`` is renamed ``cache`` in 5.24. The table,
release by release: docs/design/hf.md.
"""

from __future__ import annotations

from typing import Any

from kvguardian.core.errors import UsageError

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
    """Return the transformers version, or raise `UsageError` (exit code 3) naming the minimum supported one;
    also when transformers is not installed (the core install: callers such as the pytest plugin's
    ``kv_no_leak`` and ``Guard.attach_process`` take a `UsageError` as "no transformers to audit")."""
    if version is None:
        try:
            import transformers
        except ImportError:
            raise UsageError("transformers is not installed; kv-guardian needs transformers >= "
                             f"{'.'.join(map(str, MIN_TRANSFORMERS))} for this; fix: pip install 'kv-guardian[hf]'",
                             exit_code=3) from None

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
