"""The user's line: the innermost frame of the program that called into kv-guardian, transformers or torch.

A finding noticed inside ``generate()`` or a model's forward is noticed deep in kv-guardian's wrappers, under
transformers' and torch's frames; what the user acts on is the line of their own code that made the call. The
walk skips frames of kv-guardian, transformers, torch (and accelerate, safetensors, tokenizers, huggingface_hub)
and the standard library (``contextlib``, ``threading``, ...), by module name: no path guessing, no imports.
Used for ``warnings.warn``'s ``stacklevel`` (`warn_at_user`) and for a finding's recorded location
(`user_site`, once per request: a walk of a few dozen frames).
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType

__all__ = ["INTERNAL_PACKAGES", "KVGuardianWarning", "user_frame", "user_site", "warn_at_user"]

#: top-level packages whose frames are never the user's line
INTERNAL_PACKAGES = frozenset({"kvguardian", "transformers", "torch", "accelerate", "safetensors", "tokenizers",
                               "huggingface_hub"})
_STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
#: CPython's documented frame access (``inspect.currentframe`` is the same call behind an import of inspect)
_frame_of = sys._getframe  # noqa: SLF001


class KVGuardianWarning(UserWarning):
    """A finding noticed while the program runs (KVG101 grad-tracked KV, KVG107 an unknown cache layout), warned
    about at the user's line; silence with ``warnings.simplefilter("ignore", KVGuardianWarning)``."""


def _internal(frame: FrameType) -> bool:
    name = frame.f_globals.get("__name__")
    if not isinstance(name, str):
        return False
    top = name.partition(".")[0]
    return top in INTERNAL_PACKAGES or top in _STDLIB


def user_frame(frame: FrameType | None = None) -> tuple[FrameType | None, int]:
    """The innermost user frame at or outside ``frame`` (default: the caller's), and how many frames out it is
    (0: ``frame`` itself). (None, n) when every frame is internal (a thread of kv-guardian's own)."""
    f: FrameType | None = frame if frame is not None else _frame_of(1)
    depth = 0
    while f is not None and _internal(f):
        f = f.f_back
        depth += 1
    return f, depth


def user_site() -> str | None:
    """``path:line (function)`` of the user's line that led to this call, or None."""
    f, _ = user_frame(_frame_of(1))
    if f is None:
        return None
    return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"


def warn_at_user(message: str, category: type[Warning] = KVGuardianWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the user's line (its filename and line number), not
    to the kv-guardian frame that noticed it; to the caller's line when no user frame is on the stack."""
    f, depth = user_frame(_frame_of(1))
    warnings.warn(message, category, stacklevel=2 + depth if f is not None else 2)
