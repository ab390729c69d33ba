"""Which sub-caches of an ``EncoderDecoderCache`` hold self- and which cross-attention KV.

The instrumentation records both sub-caches when an ``EncoderDecoderCache`` is built (`note_roles`); the tracker
labels their entries with the role (`cache_role`). Held by weak reference: a sub-cache's role goes with it.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import Cache

__all__ = ["cache_role", "note_roles"]

_ROLES: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()
_edc_ids = itertools.count(1)


def note_roles(edc: Any) -> None:
    """Remember the roles of ``edc``'s two sub-caches, under one parent label ("EncoderDecoderCache#3")."""
    parent = f"{type(edc).__name__}#{next(_edc_ids)}"
    _ROLES[edc.self_attention_cache] = ("self", parent)
    _ROLES[edc.cross_attention_cache] = ("cross", parent)


def cache_role(cache: Cache) -> tuple[str, str] | None:
    """("self" | "cross", parent label) for a sub-cache of an EncoderDecoderCache, else None."""
    try:
        return _ROLES.get(cache)
    except TypeError:
        return None
