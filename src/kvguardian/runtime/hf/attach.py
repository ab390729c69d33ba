"""Attaching a guard to one transformers model: `Attachment`, and the checks that refuse what cannot be attached.

An attachment is an entry in `hf.instrument`'s registry (keyed by the model's identity), not a hook stored on
the model, so nothing of kv-guardian is in the model's ``__dict__`` or hooks: a deepcopy, pickle or
``torch.save`` round trip gives a model that is not attached (and loads where kv-guardian is not installed);
``model.to(...)``/``eval()`` keep the attachment. Details: docs/design/hf.md.
"""

from __future__ import annotations

import sys
import threading
import types
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvguardian.core.errors import UsageError
from kvguardian.runtime.hf import instrument
from kvguardian.runtime.hf.compat import check_transformers_version

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from kvguardian.runtime.hf.tracker import HFTracker

__all__ = ["Attachment", "attach_model", "check_attachable"]

#: held while an assistant is lent or returned, so two calls that lend the same assistant at once share one loan
_LOANS = threading.Lock()


class Attachment:
    """One tracker's attachment to one model; `remove` undoes it.

    At each call of the model, `call` makes the tracker active and opens a list of pending updates that the
    ``Cache.update`` wrapper appends to (O(1)); when the forward returns or raises, the whole list is observed,
    in order: back to back the bookkeeping stays in the CPU caches, which costs a fraction of observing between
    kernels. State is per call (a context variable), so threads and nested calls stay apart. ``enabled = False``
    switches it off without removing it. Measurements: docs/design/hf.md.
    """

    def __init__(self, tracker: HFTracker, model: PreTrainedModel) -> None:
        self._tracker = weakref.ref(tracker)
        self._model = weakref.ref(model, self._model_died)
        self._key: int | None = id(model)
        self.enabled = True
        self.loans = 0  # the calls using this attachment as a lent assistant (`lend`); 0: attached by the user
        instrument.register_attached(id(model), self)

    def model(self) -> Any:
        """The attached model, or None once it was collected."""
        return self._model()

    def tracker(self) -> HFTracker | None:
        return self._tracker()

    def call(self, original: Callable[..., Any], model: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``original(model, *args, **kwargs)`` (the model's ``__call__``) with its cache updates observed
        (`instrument.observe_forward`)."""
        t = self._tracker()
        if t is None or not self.enabled or self._model() is not model or instrument.compiling():
            return original(model, *args, **kwargs)
        return instrument.observe_forward(t, original, model, args, kwargs)

    def lend(self, other: Any) -> Callable[[], None] | None:
        """Attach ``other`` (the assistant model of a speculative ``generate()`` call of this model) to the same
        tracker until the returned function is called. Calls that overlap (threads) and lend the same assistant to
        the same tracker share one loan: it ends with the last of them. None, attaching nothing, when ``other``
        cannot be attached (attached by a user, or lent to another guard)."""
        t = self._tracker()
        if t is None or not self.enabled:
            return None
        with _LOANS:
            loan = instrument.attached(other)
            if isinstance(loan, Attachment) and loan.loans and loan.tracker() is t:
                loan.loans += 1
                return loan.repay
            try:
                check_attachable(other)
            except UsageError:
                return None
            loan = attach_model(t, other)
            loan.loans = 1
            return loan.repay

    def repay(self) -> None:
        """One call that was lent this attachment (`lend`) ended; the last one removes it."""
        with _LOANS:
            self.loans -= 1
            if self.loans > 0:
                return
            self.remove()

    def remove(self) -> None:
        """Detach: the model is no longer audited (idempotent)."""
        key = self._key
        if key is None:
            return
        self._key = None
        instrument.register_attached(key, self, on=False)
        instrument.uninstall_cache_patch()

    # the id may be reused by a new object from now on
    def _model_died(self, ref: weakref.ref[PreTrainedModel]) -> None:
        key = self._key
        if key is not None:
            self._key = None
            instrument.register_attached(key, self, on=False)
            # the model's use of the class-level patch ends with it (else the patch stayed installed for the
            # rest of the process); from a short-lived thread, as this weakref callback may run inside a
            # section that holds the patch lock (GC can run anywhere), where dropping it would undo half a patch.
            # Not while the interpreter finalizes: no thread starts then (start() would wait forever), and the
            # patch goes with the process.
            if not sys.is_finalizing():
                threading.Thread(target=instrument.uninstall_cache_patch, name="kvguardian-unpatch",
                                 daemon=True).start()


def _not_a_model_fix(model: object, torch: types.ModuleType, transformers: types.ModuleType) -> str:
    """What to attach instead of ``model`` (not a ``PreTrainedModel``)."""
    if isinstance(model, type):
        return f"attach an instance, e.g. guard.attach({model.__name__}.from_pretrained(...))"
    for attr, how in (("model", "a pipeline: guard.attach(pipe.model)"),
                      ("_orig_mod", "a torch.compile'd model: attach the model before compiling it"),
                      ("module", "a DataParallel/DDP wrapper: guard.attach(wrapper.module)")):
        if isinstance(getattr(model, attr, None), transformers.PreTrainedModel):
            return how
    base = getattr(model, "get_base_model", None)
    if callable(base):
        return "a PEFT model: guard.attach(peft_model.get_base_model())"
    if isinstance(model, torch.nn.Module):
        return ("for a custom torch model use guard.track_module(model) (preallocated KV buffers) or "
                "guard.track(keys, values, layer=i)")
    return ("pass the model object itself, e.g. guard.attach(AutoModelForCausalLM.from_pretrained(...)); for KV "
            "tensors of your own use guard.track(keys, values, layer=i)")


def _describe(obj: object) -> str:
    """``a Linear``, ``an int (42)``: what was passed, short (never its whole repr)."""
    if obj is None:
        return "None"
    name = type(obj).__name__ if not isinstance(obj, type) else f"class {obj.__name__}"
    article = "an" if name[:1].lower() in "aeiou" else "a"
    if isinstance(obj, (int, float, str, bytes)):
        text = repr(obj)
        return f"{article} {name} ({text if len(text) <= 40 else text[:37] + '...'})"
    return f"{article} {name}"


def check_attachable(model: object) -> None:
    """Raise `UsageError` unless ``model`` can be attached: a transformers ``PreTrainedModel`` (transformers
    5.x installed) that no guard has attached yet."""
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
        raise UsageError(f"guard.attach() got {_describe(model)}, not a transformers PreTrainedModel; "
                         f"fix: {_not_a_model_fix(model, torch, transformers)}")
    if instrument.attached(model) is not None:
        raise UsageError(f"{type(model).__name__} is already attached to a guard; fix: detach() it first")


def attach_model(tracker: HFTracker, model: PreTrainedModel) -> Attachment:
    """Instrument ``model`` (a transformers ``PreTrainedModel``) for ``tracker``.

    Raises:
        UsageError: see `check_attachable`.
    """
    check_attachable(model)
    instrument.install_cache_patch()
    try:
        instrument.install_model_patch(type(model))
        return Attachment(tracker, model)
    except Exception:
        instrument.uninstall_cache_patch()
        raise
