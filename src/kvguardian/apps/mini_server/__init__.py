"""An OpenAI-compatible server over the paged mini engine: API keys as tenants, prefix-cache modes
(``off``, ``global``, ``per-salt``, ``per-tenant``), vLLM's ``cache_salt``. See `app` and `tenancy`.

``import kvguardian.apps.mini_server`` is cheap; FastAPI and torch load when an app is built.
"""

from __future__ import annotations

from kvguardian.apps.mini_server.tenancy import CACHE_MODES, KeyRing, namespace_of

__all__ = ["CACHE_MODES", "KeyRing", "create_app", "namespace_of"]


def create_app(*args: object, **kwargs: object) -> object:
    """`kvguardian.apps.mini_server.app.create_app` (imported on first use)."""
    from kvguardian.apps.mini_server.app import create_app as _create

    return _create(*args, **kwargs)  # type: ignore[arg-type]
