"""Instrument transformers at class level: ``Cache.update`` (and crop/reset), ``PreTrainedModel.__call__`` and
``generate``. Nothing is ever stored on a model or cache instance.

``Cache.update`` is wrapped once, process-wide, with a signature every 5.x release accepts; the wrapper calls
the original first, so the model's result never changes. An update goes to the tracker of the attached model
running a forward, else to the process tracker: inside a top-level model forward it is queued until the forward
returns (`observe_forward`), outside one observed at once. Under ``torch.compile`` the wrappers
pass straight through. ``Cache`` also gets a ``__deepcopy__`` so a kept copy is still audited. Which tracker
sees what, and why: docs/design/hf.md.
"""

from __future__ import annotations

import contextvars
import copy
import copyreg
import functools
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from kvguardian.core import faults as _faults
from kvguardian.runtime.hf.compat import MIN_TRANSFORMERS, check_transformers_version
from kvguardian.runtime.hf.observers import CacheUpdate
from kvguardian.runtime.hf.roles import cache_role, note_roles
from kvguardian.runtime.hf.states import tracker_of

if TYPE_CHECKING:
    import torch
    from transformers import Cache

    from kvguardian.runtime.hf.tracker import HFTracker

__all__ = [
    "ACTIVE",
    "MIN_TRANSFORMERS",
    "PENDING",
    "Attached",
    "KeyInfo",
    "attached",
    "cache_role",
    "check_transformers_version",
    "compiling",
    "install_cache_patch",
    "install_forward_patch",
    "install_generate_patch",
    "install_model_patch",
    "observe_forward",
    "process_tracker",
    "register_attached",
    "set_process_tracker",
    "uninstall_cache_patch",
]

#: The tracker whose attached model is running a forward in this context.
ACTIVE: contextvars.ContextVar[HFTracker | None] = contextvars.ContextVar("kvguardian_active_tracker",
                                                                         default=None)
#: The cache updates of the attached model's running forward, observed when it returns (see `Attachment`).
PENDING: contextvars.ContextVar[list[CacheUpdate] | None] = contextvars.ContextVar(
    "kvguardian_pending_updates", default=None)


class KeyInfo(NamedTuple):
    """What a deferred update keeps of its ``key_states`` (the new tokens' keys): shape, dtype and device, not
    the tensor - holding each layer's new keys until the forward returns would raise the model's peak memory."""

    shape: Any  # torch.Size
    dtype: Any
    device: Any

    def dim(self) -> int:
        return len(self.shape)


# The positional construction of KeyInfo and CacheUpdate, once per layer per step: tuple.__new__ is cheaper than
# CacheUpdate(...), and far cheaper than by keyword (docs/design/hf.md); the order is the field order.
_new_tuple = tuple.__new__

_PROCESS: list[HFTracker | None] = [None]  # the process tracker (kv-guardian run, pytest plugin), or None
_PROCESS_GENERATE = [False]  # whether the process tracker makes each top-level generate() an implicit request
_patch_lock = threading.RLock()
_patch_users = 0
_originals: dict[tuple[type, str], Any] = {}  # (class, attribute) -> original, for uninstall
_observed = [0]  # updates observed by the base wrapper: lets an overriding subclass's wrapper skip doubles


def _never() -> bool:
    return False


#: ``torch.compiler.is_dynamo_compiling`` once the patch is installed: True only while dynamo traces the caller
#: (dynamo folds it to a constant), so under ``torch.compile`` every wrapper passes straight through
_compiling: Callable[[], bool] = _never


class Attached(Protocol):
    """What the class-level wrappers need of an attached model's attachment (`hf.attach.Attachment`)."""

    def model(self) -> Any: ...

    def tracker(self) -> HFTracker | None: ...

    def call(self, original: Callable[..., Any], model: object, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any: ...

    def lend(self, other: object) -> Callable[[], None] | None: ...


#: id(model) -> its attachment; an entry leaves when the attachment is removed or the model dies
_ATTACHED: dict[int, Attached] = {}


def attached(model: object) -> Attached | None:
    """The attachment of ``model`` (this very object, not a copy of it), or None."""
    att = _ATTACHED.get(id(model))
    return att if att is not None and att.model() is model else None


def register_attached(key: int, attachment: Attached, *, on: bool = True) -> None:
    """Record the attachment of the model whose ``id()`` is ``key``, found by the class-level wrappers (``on``);
    or forget it (``on=False``: only if it is still that attachment's entry)."""
    if on:
        _ATTACHED[key] = attachment
    elif _ATTACHED.get(key) is attachment:
        del _ATTACHED[key]


def compiling() -> bool:
    """Whether dynamo is tracing the caller (``torch.compile``): then kv-guardian's wrappers pass through."""
    return _compiling()


def process_tracker() -> HFTracker | None:
    """The tracker that sees every cache update of the process not claimed by an attached model, or None."""
    return _PROCESS[0]


def set_process_tracker(tracker: HFTracker | None, *, generate: bool = True) -> HFTracker | None:
    """Make ``tracker`` see every cache update of the process not claimed by an attached model (None: stop).
    Installs the cache patch (and, with ``generate``, the class-level generate patch, which imports
    ``transformers.generation.utils``, and the forward patch; without, the forward patch only if
    ``transformers.modeling_utils`` is loaded: `install_forward_patch` does it later). Returns the previous
    process tracker."""
    previous = _PROCESS[0]
    if tracker is not None and previous is None:
        check_transformers_version()
        install_cache_patch(generate=generate)
        if generate or hasattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel"):
            install_forward_patch()
    _PROCESS[0] = tracker
    if tracker is None and previous is not None:
        _PROCESS_GENERATE[0] = False
        uninstall_cache_patch()
    return previous


def _target_tracker() -> HFTracker | None:
    t = ACTIVE.get()
    return t if t is not None else _PROCESS[0]


def _tracker_for(cache: Cache) -> HFTracker | None:
    """The tracker of this context, else the one that follows ``cache`` (a crop or reorder between forwards)."""
    t = _target_tracker()
    return t if t is not None else tracker_of(cache)  # type: ignore[no-any-return]


def _wrap_update(original: Callable[..., Any], *, base: bool) -> Any:
    @functools.wraps(original)
    def update(self: Any, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> Any:
        if base:
            out = original(self, key_states, value_states, layer_idx, *args, **kwargs)
        else:  # an override: observe only if it did not reach the base wrapper (super().update)
            before = _observed[0]
            out = original(self, key_states, value_states, layer_idx, *args, **kwargs)
            if _observed[0] != before:
                return out
        if _compiling():  # first: dynamo cannot trace a context variable
            return out
        tracker = ACTIVE.get()
        if tracker is None:
            tracker = _PROCESS[0]
            if tracker is None:
                return out
        else:
            pending = PENDING.get()
            if pending is not None:  # inside an attached model's forward: observed when it returns
                _observed[0] += 1
                # the returned tensors only matter for a cache with no `layers` list (the generic path); a
                # quantized cache returns fresh dequantized copies, which must not be kept alive meanwhile
                ret = out if type(getattr(self, "layers", None)) is not list else None
                key: Any = None
                if not pending or pending[-1][0] is not self:
                    # the cache's first update in this forward, the only one whose new keys the tracker may read
                    # (a request's first update of a cache: its prefill size and init fields); the later ones
                    # read nothing of the tensor (a torch attribute read costs microseconds between kernels)
                    try:  # keep the new keys' shape, dtype and device, not the tensor
                        key = _new_tuple(KeyInfo, (key_states.shape, key_states.dtype, key_states.device))
                    except Exception:  # not a tensor: keep the object itself
                        key = key_states
                pending.append(_new_tuple(CacheUpdate, (self, layer_idx, key, args, kwargs, ret)))
                return out
        _observed[0] += 1
        try:
            tracker.on_update(_new_tuple(CacheUpdate, (self, layer_idx, key_states, args, kwargs, out)))
        except Exception as exc:
            tracker.host.fail("cache.update", exc)
        return out

    update.__kvguardian_original__ = original  # type: ignore[attr-defined]
    return update


#: Cache methods that replace every layer's tensors with new ones (beam search reorders after each step;
#: contrastive and assisted decoding repeat and select): the tracker observes the layers again after them
RESHAPES = ("reorder_cache", "batch_repeat_interleave", "batch_select_indices")


def _wrap_evict(original: Callable[..., Any], name: str) -> Any:
    """``crop``/``reset`` (an evict event) or one of `RESHAPES` (the layers observed again), told to the tracker
    after the original ran."""
    @functools.wraps(original)
    def evict(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        tracker = None if _compiling() else _tracker_for(self)
        if tracker is not None:
            pending = PENDING.get()
            if pending:  # keep the order: the forward's earlier updates first
                tracker.on_updates(pending[:], None)
                pending.clear()
            try:
                if name in RESHAPES:
                    tracker.on_reshape(self)
                else:
                    tracker.on_evict(self, f"{name}({', '.join(map(str, args))})")
            except Exception as exc:
                tracker.host.fail("cache.update", exc)
        return out

    evict.__kvguardian_original__ = original  # type: ignore[attr-defined]
    return evict


def _wrap_edc_init(original: Callable[..., Any]) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            note_roles(self)
        except Exception:  # never break the model
            pass

    __init__.__kvguardian_original__ = original  # type: ignore[attr-defined]
    return __init__


#: the stdlib's reconstruction step of `copy.deepcopy` (private, there since Python 2; without it no copy hook)
_RECONSTRUCT: Any = vars(copy).get("_reconstruct")


def _cache_deepcopy(self: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy`` of a cache: what `copy.deepcopy` does for an object without ``__deepcopy__`` (a
    ``copyreg`` reducer or ``__reduce_ex__(4)``, then the stdlib's own reconstruction, so the copy is the same
    object graph), then the copy is told to the tracker that knows the original (fail-open)."""
    reductor = copyreg.dispatch_table.get(type(self))
    rv = reductor(self) if reductor is not None else self.__reduce_ex__(4)
    if isinstance(rv, str):
        return self
    y = _RECONSTRUCT(self, memo, *rv)  # the stdlib's own step: the copy is exactly the one made without us
    if not _compiling():
        _note_copy(self, y)
    return y


def _note_copy(original: Callable[..., Any], dup: object) -> None:
    seen: set[int] = set()
    for tracker in (ACTIVE.get(), _PROCESS[0], *(a.tracker() for a in list(_ATTACHED.values()))):
        if tracker is None or id(tracker) in seen:
            continue
        seen.add(id(tracker))
        try:
            if tracker.note_copy(original, dup):
                return
        except Exception as exc:
            tracker.host.fail("cache.update", exc)


def _set(cls: type, name: str, value: object) -> None:
    if (cls, name) not in _originals:
        _originals[(cls, name)] = cls.__dict__.get(name)
    setattr(cls, name, value)


def _wrap_override(cls: type) -> None:
    fn = cls.__dict__.get("update")
    if fn is not None and not hasattr(fn, "__kvguardian_original__"):
        _set(cls, "update", _wrap_update(fn, base=False))
    for name in RESHAPES:  # a subclass that reorders its own way
        fn = cls.__dict__.get(name)
        if fn is not None and not hasattr(fn, "__kvguardian_original__"):
            _set(cls, name, _wrap_evict(fn, name))


def _all_subclasses(cls: type) -> list[type]:
    out: list[type] = []
    stack: list[type] = list(cls.__subclasses__())
    while stack:
        c = stack.pop()
        out.append(c)
        stack.extend(c.__subclasses__())
    return out


def install_cache_patch(*, generate: bool = False) -> None:
    """Wrap the cache methods (idempotent, reference counted); ``generate`` also wraps
    ``GenerationMixin.generate`` at class level for the process guard."""
    global _patch_users, _compiling
    with _patch_lock:
        import torch
        from transformers import cache_utils

        _compiling = getattr(getattr(torch, "compiler", None), "is_dynamo_compiling", _never)

        cache_cls = cache_utils.Cache
        if (cache_cls, "update") not in _originals:
            _set(cache_cls, "update", _wrap_update(cache_cls.update, base=True))
            for name in ("crop", "reset", *RESHAPES):
                if name in cache_cls.__dict__:
                    _set(cache_cls, name, _wrap_evict(cache_cls.__dict__[name], name))
            if "__deepcopy__" not in cache_cls.__dict__ and _RECONSTRUCT is not None:
                _set(cache_cls, "__deepcopy__", _cache_deepcopy)
            edc = getattr(cache_utils, "EncoderDecoderCache", None)
            if edc is not None:
                _set(edc, "__init__", _wrap_edc_init(edc.__init__))
            for sub in _all_subclasses(cache_cls):
                _wrap_override(sub)
            previous_hook = cache_cls.__dict__.get("__init_subclass__")

            def __init_subclass__(cls: type, **kw: Any) -> None:
                if previous_hook is not None:
                    previous_hook.__func__(cls, **kw)
                else:
                    super(cache_cls, cls).__init_subclass__(**kw)  # type: ignore[misc]
                try:
                    _wrap_override(cls)
                except Exception:
                    pass

            _set(cache_cls, "__init_subclass__", classmethod(__init_subclass__))
        _patch_users += 1
        if generate:
            install_generate_patch()


def install_generate_patch() -> None:
    """Make each top-level ``generate()`` call an implicit request of the process tracker: wraps
    ``GenerationMixin.generate`` at class level (idempotent; undone with the cache patch)."""
    with _patch_lock:
        from transformers.generation.utils import GenerationMixin

        _wrap_generate_of(GenerationMixin)
        _PROCESS_GENERATE[0] = True


def install_forward_patch() -> None:
    """Wrap ``PreTrainedModel.__call__`` (idempotent; undone with the cache patch): the cache updates of a
    top-level forward are observed together when it returns (`observe_forward`). Imports
    ``transformers.modeling_utils``."""
    with _patch_lock:
        from transformers import PreTrainedModel

        if (PreTrainedModel, "__call__") not in _originals:
            _set(PreTrainedModel, "__call__", _wrap_model_call(PreTrainedModel.__call__))


def install_model_patch(model_cls: type) -> None:
    """The class-level wrappers an attached model of ``model_cls`` needs (idempotent; undone with the cache
    patch): ``PreTrainedModel.__call__`` (its forward), and ``generate`` of `GenerationMixin` and of every class
    of ``model_cls``'s hierarchy that overrides it."""
    with _patch_lock:
        from transformers.generation.utils import GenerationMixin

        install_forward_patch()
        _wrap_generate_of(GenerationMixin)
        for cls in model_cls.__mro__:
            if "generate" in cls.__dict__ and isinstance(cls.__dict__["generate"], type(_never)):
                _wrap_generate_of(cls)


def _wrap_generate_of(cls: type) -> None:
    fn = cls.__dict__.get("generate")
    if fn is not None and not hasattr(fn, "__kvguardian_original__"):
        _set(cls, "generate", _wrap_generate(fn))


def uninstall_cache_patch() -> None:
    """Drop one user of the patch; restore every original when none is left."""
    global _patch_users
    with _patch_lock:
        _patch_users = max(0, _patch_users - 1)
        if _patch_users or not _originals:
            return
        for (cls, name), original in list(_originals.items()):
            if original is None:
                try:
                    delattr(cls, name)
                except AttributeError:
                    pass
            else:
                setattr(cls, name, original)
        _originals.clear()
        _PROCESS_GENERATE[0] = False


def _wrap_model_call(original: Callable[..., Any]) -> Any:
    @functools.wraps(original)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        att = _ATTACHED.get(id(self))
        if att is not None:
            return att.call(original, self, args, kwargs)
        tracker = _PROCESS[0]
        if tracker is None or _compiling() or ACTIVE.get() is not None:  # nested: the outer forward observes
            return original(self, *args, **kwargs)
        return observe_forward(tracker, original, self, args, kwargs)

    __call__.__kvguardian_original__ = original  # type: ignore[attr-defined]
    return __call__


def observe_forward(tracker: HFTracker, original: Callable[..., Any], model: object, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    """Run ``original(model, *args, **kwargs)`` (a model's ``__call__``) with ``tracker`` active: the
    ``Cache.update`` wrapper queues the forward's updates (O(1) each), and the whole list is observed in order
    when the forward returns or raises (`HFTracker.on_updates`, which samples decode steps): back to back the
    bookkeeping stays in the CPU caches. State is per call (context variables), so threads and nested calls
    stay apart. Fails open: the model's result and exceptions are its own."""
    try:
        if _faults.FAULTS:
            _faults.maybe_fail("forward.pre")
        tokens = (ACTIVE.set(tracker), PENDING.set([]))
    except Exception as exc:
        tracker.host.fail("forward.pre", exc)
        return original(model, *args, **kwargs)
    started = tracker.ledger.clock()
    try:
        return original(model, *args, **kwargs)
    finally:
        _forward_done(tracker, tokens, started)


def _forward_done(tracker: HFTracker, tokens: tuple[Any, Any], started: float) -> None:
    """After a forward returned or raised: observe its queued updates (fail open)."""
    try:
        updates = PENDING.get()
        ACTIVE.reset(tokens[0])
        PENDING.reset(tokens[1])
        if updates:
            tracker.on_updates(updates, started)
        if _faults.FAULTS:
            _faults.maybe_fail("forward.post")
    except Exception as exc:
        tracker.host.fail("forward.post", exc)


def _generate_tracker(model: object) -> HFTracker | None:
    """Whose implicit request a top-level ``model.generate()`` is: the guard ``model`` is attached to, else the
    process guard (when it makes generate calls requests)."""
    att = attached(model)
    tracker = att.tracker() if att is not None else None
    if tracker is None and _PROCESS_GENERATE[0]:
        tracker = _PROCESS[0]
    return tracker


def _wrap_generate(original: Callable[..., Any]) -> Any:
    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracker = _generate_tracker(self)
        if tracker is None or _compiling():
            return original(self, *args, **kwargs)
        undo = _lend_assistant(self, kwargs.get("assistant_model"))
        try:
            if tracker.host.current_request() is not None:
                return original(self, *args, **kwargs)
            return _generate_as_request(tracker, original, (self, *args), kwargs)
        finally:
            if undo is not None:
                undo()

    generate.__kvguardian_original__ = original  # type: ignore[attr-defined]
    return generate


def _lend_assistant(model: object, assistant: object) -> Callable[[], None] | None:
    """Speculative decoding (``generate(assistant_model=...)``) of an attached model: the assistant's forwards
    (its own caches) are observed by the same tracker, as KV of the same request, for the call; returns what
    undoes it (None: nothing to undo - no assistant, the model not attached, the assistant attached already)."""
    if assistant is None:
        return None
    att = attached(model)
    if att is None:
        return None
    try:
        return att.lend(assistant)
    except Exception as exc:  # fail open: the assistant is not observed
        tracker = att.tracker()
        if tracker is not None:
            tracker.host.fail("generate.enter", exc)
        return None


def _generate_as_request(tracker: HFTracker, fn: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
    """Run ``fn`` (a generate call) as one implicit request of the tracker's host; what it returns is noted
    (weakly) as where the request's cache is likely held."""
    host = tracker.host
    opened = None
    result = None
    try:
        _faults.maybe_fail("generate.enter")
        opened = host.begin_implicit("generate")
    except Exception as exc:
        host.fail("generate.enter", exc)
    try:
        result = fn(*args, **kwargs)
        return result
    finally:
        if opened is not None:
            try:
                _faults.maybe_fail("generate.exit")
                if result is not None:
                    tracker.note_result(opened.info, result)
                result = None
                host.end_implicit(opened)
            except Exception as exc:
                host.fail("generate.exit", exc)
