"""Instrument transformers' caches: one wrapper on ``Cache.update`` and per-model forward hooks.

``Cache.update`` is wrapped once, process-wide, with a ``(k, v, layer_idx, *args, **kwargs)`` signature so it
works with every 5.x release (5.0 passes ``cache_kwargs``; 5.5+ passes ``*args, **kwargs``). The wrapper
calls the original first and only then looks at the layer, so the model's result is never changed; if no
guard is active (no attached model is running a forward) it costs one context-variable read.
Which guard sees an update is decided by forward hooks on each attached model, so two guards on two
models never see each other's caches.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import weakref
from typing import TYPE_CHECKING, Any

from kvguardian import _faults
from kvguardian._errors import UsageError
from kvguardian.hf.compat import version_tuple

if TYPE_CHECKING:
    from kvguardian.guard import Guard

__all__ = ["Attachment", "attach_model", "install_cache_patch", "uninstall_cache_patch"]

MIN_TRANSFORMERS = (5, 0)

#: The guard whose attached model is running a forward in this context.
ACTIVE: contextvars.ContextVar[Guard | None] = contextvars.ContextVar("kvguardian_active_guard", default=None)

_patch_lock = threading.Lock()
_patch_users = 0
_original_update: Any = None


def check_transformers_version() -> str:
    """Return the transformers version, or raise `UsageError` naming the minimum supported one."""
    import transformers

    version = transformers.__version__
    if version_tuple(version)[:2] < MIN_TRANSFORMERS:
        raise UsageError(
            f"transformers {version} is not supported; kv-guardian needs transformers >= "
            f"{'.'.join(map(str, MIN_TRANSFORMERS))}; fix: pip install 'transformers>=5,<6'"
        )
    return version


def install_cache_patch() -> None:
    """Wrap ``transformers.cache_utils.Cache.update`` (idempotent, reference counted)."""
    global _patch_users, _original_update
    with _patch_lock:
        _patch_users += 1
        if _original_update is not None:
            return
        from transformers import cache_utils

        original = cache_utils.Cache.update

        @functools.wraps(original)
        def update(self: Any, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
            out = original(self, key_states, value_states, layer_idx, *args, **kwargs)
            guard = ACTIVE.get()
            if guard is not None:
                try:
                    guard._on_cache_update(self, layer_idx)
                except Exception as exc:
                    guard._fail("cache.update", exc)
            return out

        update.__kvguardian_original__ = original  # type: ignore[attr-defined]
        cache_utils.Cache.update = update  # type: ignore[method-assign]
        _original_update = original


def uninstall_cache_patch() -> None:
    """Drop one user of the patch; restore the original method when none is left."""
    global _patch_users, _original_update
    with _patch_lock:
        _patch_users = max(0, _patch_users - 1)
        if _patch_users or _original_update is None:
            return
        from transformers import cache_utils

        cache_utils.Cache.update = _original_update  # type: ignore[method-assign]
        _original_update = None


class Attachment:
    """The hooks one guard installed on one model; `remove` undoes all of them."""

    def __init__(self, guard: Guard, model: Any) -> None:
        self._model = weakref.ref(model)
        self._handles: list[Any] = []
        self._tls = threading.local()
        self._had_generate = "generate" in vars(model)
        guard_ref = weakref.ref(guard)

        def pre(module: Any, args: Any) -> None:
            g = guard_ref()
            if g is None:
                return
            try:
                _faults.maybe_fail("forward.pre")
                stack = getattr(self._tls, "tokens", None)
                if stack is None:
                    stack = self._tls.tokens = []
                stack.append(ACTIVE.set(g))
            except Exception as exc:
                g._fail("forward.pre", exc)

        def post(module: Any, args: Any, output: Any) -> None:
            g = guard_ref()
            stack = getattr(self._tls, "tokens", None)
            try:
                if stack:
                    ACTIVE.reset(stack.pop())
                _faults.maybe_fail("forward.post")
            except Exception as exc:
                if g is not None:
                    g._fail("forward.post", exc)

        self._handles.append(model.register_forward_pre_hook(pre))
        self._handles.append(model.register_forward_hook(post, always_call=True))

        original_generate = model.generate

        @functools.wraps(original_generate)
        def generate(*args: Any, **kwargs: Any) -> Any:
            g = guard_ref()
            if g is None or g.current_request() is not None:
                return original_generate(*args, **kwargs)
            opened = None
            try:
                _faults.maybe_fail("generate.enter")
                opened = g._begin_implicit("generate")
            except Exception as exc:
                g._fail("generate.enter", exc)
            try:
                return original_generate(*args, **kwargs)
            finally:
                if opened is not None:
                    try:
                        _faults.maybe_fail("generate.exit")
                        g._end_implicit(*opened)
                    except Exception as exc:
                        g._fail("generate.exit", exc)

        generate.__kvguardian_wrapper__ = True  # type: ignore[attr-defined]
        # an instance attribute: nothing in state_dict, removed by `remove`
        model.generate = generate

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        model = self._model()
        if model is not None and getattr(vars(model).get("generate"), "__kvguardian_wrapper__", False):
            del model.generate
        uninstall_cache_patch()


def attach_model(guard: Guard, model: Any) -> Attachment:
    """Instrument ``model`` (a transformers ``PreTrainedModel``) for ``guard``.

    Raises:
        UsageError: ``model`` is not a transformers model, transformers is too old, or the model is
            already attached to a guard.
    """
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise UsageError(
            f"guard.attach() needs torch and transformers ({exc.name} is missing); "
            "fix: pip install 'kv-guardian[hf]'",
            exit_code=3,
        ) from None
    check_transformers_version()
    if not isinstance(model, transformers.PreTrainedModel):
        kind = type(model).__name__
        hint = "guard.track(keys, values, layer=i)" if isinstance(model, torch.nn.Module) else "a model"
        raise UsageError(
            f"guard.attach() got a {kind}, not a transformers PreTrainedModel; fix: for a custom torch model "
            f"call {hint} after each cache write"
        )
    if getattr(vars(model).get("generate"), "__kvguardian_wrapper__", False):
        raise UsageError(
            f"{type(model).__name__} is already attached to a guard; fix: detach() it first"
        )
    install_cache_patch()
    try:
        return Attachment(guard, model)
    except Exception:
        uninstall_cache_patch()
        raise
