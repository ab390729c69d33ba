"""The per-pod KV budget: from an argument, ``KVG_KV_BUDGET_MB``, or the article's ``NV_GPU_KV_CACHE_MB``.

The device plugin (`kvguardian.ops.k8s.plugin`) injects both variables on Allocate; a guard inside the container
reads them here. MiB, a positive integer, no larger than the device when its size is known.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from kvguardian.core.errors import UsageError

__all__ = ["ALIAS", "ENV", "MIB", "Budget", "kv_budget"]

ENV = "KVG_KV_BUDGET_MB"
ALIAS = "NV_GPU_KV_CACHE_MB"  # the article's name (§4.4), accepted as an alias
MIB = 1 << 20


class Budget(tuple[int, str]):
    """(bytes, where it came from)."""

    @property
    def nbytes(self) -> int:
        return self[0]

    @property
    def source(self) -> str:
        return self[1]


def _parse(text: object, where: str) -> int:
    try:
        mb = int(str(text).strip())
    except ValueError:
        raise UsageError(f"{where}={text!r} is not a whole number of MiB; fix: e.g. {where}=2048") from None
    if mb <= 0:
        raise UsageError(f"{where}={mb}: a KV budget of {mb} MiB admits nothing; fix: a positive number of MiB, "
                         f"e.g. {where}=2048 (or unset it to guard without a KV budget)")
    return mb


def kv_budget(mb: int | str | None = None, *, env: Mapping[str, str] | None = None,
              device_bytes: int | None = None) -> Budget | None:
    """The KV budget in bytes and its source, or None when none is configured.

    Precedence: ``mb`` (an argument), then ``KVG_KV_BUDGET_MB``, then ``NV_GPU_KV_CACHE_MB``.

    Raises:
        UsageError: not a whole number, 0 or negative, or larger than ``device_bytes``.
    """
    env = os.environ if env is None else env
    if mb is not None:
        value, where = _parse(mb, "--kv-budget-mb"), "--kv-budget-mb"
    elif env.get(ENV, "").strip():
        value, where = _parse(env[ENV], ENV), ENV
    elif env.get(ALIAS, "").strip():
        value, where = _parse(env[ALIAS], ALIAS), ALIAS
    else:
        return None
    nbytes = value * MIB
    if device_bytes is not None and nbytes > device_bytes:
        raise UsageError(f"{where}={value}: the KV budget is larger than the device ({device_bytes // MIB} MiB); fix: "
                         f"at most {device_bytes // MIB}, less what weights and activations need")
    return Budget((nbytes, where))
