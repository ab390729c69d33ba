"""Custom torch models: audit KV buffers preallocated on a model's modules (gpt-fast, torchtune style).

`ModuleTracker` finds the ``k_cache``/``v_cache`` buffers once by walking ``model.modules()`` and observes them
after every forward (O(layers)). Buffers the model holds are declared retained; ones it no longer holds but
something else does become orphaned. ``guard.track_module(model, positions="input_pos")`` enables it; a model
that allocates per step calls ``guard.track(k, v, layer=i)``. Example: docs/design/sources.md.
"""

from __future__ import annotations

import itertools
import re
import weakref
from typing import TYPE_CHECKING, Any

from kvguardian.core import faults as _faults
from kvguardian.core.errors import UsageError
from kvguardian.core.ledger import EntrySite, Record, RequestInfo, Update

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from kvguardian.runtime.sources.host import SourceHost

__all__ = ["DEFAULT_BUFFER_PATTERN", "ModuleTracker", "find_kv_buffers", "track_tensors"]

#: Names of KV buffers in the usual custom models: k_cache/v_cache (gpt-fast, torchtune), cache_k/cache_v
#: (Llama reference code), key_cache/value_cache.
DEFAULT_BUFFER_PATTERN = re.compile(r"^(k|v|key|value)_cache$|^cache_(k|v)$")

_ids = itertools.count(1)


def track_tensors(host: SourceHost, kv: tuple[torch.Tensor, torch.Tensor | None], *, layer: int | None,
                  source: str) -> None:
    """``guard.track(keys, values, layer=i)``: record the K and V tensors ``kv`` (V may be None) of a custom model's
    cache for the current request, in the slot (request, layer, kind). Fails open (raises only when strict)."""
    try:
        _faults.maybe_fail("track")
        req = host.current_request()
        owner = req.request_id if req is not None else None
        observe = host.ledger.observe
        for kind, t in zip(("k", "v"), kv):
            if t is None:
                continue
            observe(t, EntrySite(kind, layer, source, (owner, layer, kind)), req)
            if t.requires_grad:
                host.note_grad(t, layer)
    except Exception as exc:
        host.fail("track", exc)


def find_kv_buffers(model: torch.nn.Module,
                    pattern: re.Pattern[str] = DEFAULT_BUFFER_PATTERN) -> list[tuple[int, str, Any]]:
    """``(layer index, "k"/"v", (weakref to module, attribute))`` for every KV buffer of ``model``, layers
    numbered in ``model.modules()`` order of the modules that own them."""
    out = []
    layer_of: dict[int, int] = {}
    for module in model.modules():
        names = [n for n, b in module.named_buffers(recurse=False) if b is not None and pattern.match(n)]
        names += [n for n, v in vars(module).items() if pattern.match(n) and hasattr(v, "untyped_storage")
                  and n not in names]
        for name in sorted(names):
            layer = layer_of.setdefault(id(module), len(layer_of))
            kind = "k" if name.startswith(("k", "cache_k")) else "v"
            out.append((layer, kind, (weakref.ref(module), name)))
    return out


class ModuleTracker:
    """Observes a custom model's preallocated KV buffers after each of its forwards (a `Source`).

    Args:
        host: what the tracker reports to (a guard's `RequestScope`; ``guard.track_module`` passes it).
        model: a ``torch.nn.Module``.
        pattern: regular expression for buffer names (default `DEFAULT_BUFFER_PATTERN`).
        positions: how to know the filled tokens: the name of a forward keyword argument, or the index of a
            positional one, holding the written positions (gpt-fast's ``input_pos``); None: unknown.
        retain: declare the buffers the model holds as retained (default True).

    Raises:
        UsageError: ``model`` is not a torch module, or no buffer matches ``pattern``.
    """

    def __init__(self, host: SourceHost, model: torch.nn.Module, *, pattern: str | re.Pattern[str] | None = None,
                 positions: str | int | None = None, retain: bool = True) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"track_module() needs a torch.nn.Module, got {type(model).__name__}; fix: pass the "
                             "model, or call guard.track(keys, values, layer=i) for tensors")
        self.pattern = re.compile(pattern) if isinstance(pattern, str) else (pattern or DEFAULT_BUFFER_PATTERN)
        self._host = weakref.ref(host)
        self._model = weakref.ref(model)
        self.positions = positions
        self._pos_index: int | None = positions if isinstance(positions, int) else None
        if isinstance(positions, str):  # also find it when passed positionally: model(idx, input_pos)
            import inspect

            try:
                names = [p for p in inspect.signature(model.forward).parameters if p != "self"]
                self._pos_index = names.index(positions) if positions in names else None
            except (TypeError, ValueError):
                self._pos_index = None
        self.label = f"{type(model).__name__}#{next(_ids)}"
        self._buffers = find_kv_buffers(model, self.pattern)
        self._sites: dict[tuple[int, str, str], EntrySite] = {}  # (layer, kind, module class) -> its site
        if not self._buffers:
            raise UsageError(
                f"no KV buffer in {type(model).__name__} matches {self.pattern.pattern!r}; fix: pass "
                "pattern= with your buffer names (e.g. pattern=r'^(k|v)_buf$'), or call guard.track()"
            )
        self._filled: int | None = None
        self.manual: RequestInfo | None = None
        self._manual_ids = itertools.count(1)
        self._handle = model.register_forward_hook(self._after_forward, with_kwargs=True, always_call=False)
        host.add_source(self)
        if retain:
            host.retain(model, reason=f"preallocated KV buffers of {type(model).__name__} (bounded by construction)")

    def describe(self) -> dict[str, Any]:
        return {"model": self.label, "buffers": len(self._buffers),
                "layers": len({layer for layer, _, _ in self._buffers}), "filled_tokens": self._filled}

    def _after_forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                       output: object) -> None:
        host = self._host()
        if host is None:
            return
        try:
            if _faults.FAULTS:
                _faults.maybe_fail("track")
            self._observe(host, args, kwargs)
        except Exception as exc:
            host.fail("track", exc)

    def _observe(self, host: SourceHost, args: Any, kwargs: Any) -> None:
        self._note_positions(args, kwargs)
        req = host.current_request()
        if req is None:
            req = self.manual
            if req is None or req.ended is not None:
                host.request_starting()
                req = self.manual = host.ledger.begin_request(
                    f"{self.label}-{next(self._manual_ids)}", None, implicit=True)
        observe = host.ledger.observe
        for layer, kind, (mref, name) in self._buffers:
            module = mref()
            t = getattr(module, name, None) if module is not None else None
            if t is None:
                continue
            cap = int(t.shape[-2]) if t.dim() >= 2 else None
            observe(t, self._site(layer, kind, type(module).__name__), req, Update(self._filled, cap))
            if t.requires_grad:
                host.note_grad(t, layer)

    def _note_positions(self, args: Any, kwargs: Any) -> None:
        """The written positions of this forward, when known: filled tokens, and a prefill's re-scan."""
        pos = kwargs.get(self.positions) if isinstance(self.positions, str) else None
        if pos is None and self._pos_index is not None and self._pos_index < len(args):
            pos = args[self._pos_index]
        if pos is not None and hasattr(pos, "numel") and pos.numel():
            if int(pos.min()) == 0:  # a prefill: the model may have re-created its caches since (once a request)
                self.refresh()
            self._filled = int(pos.max()) + 1  # sequential writes: positions 0..max hold tokens

    def _site(self, layer: int, kind: str, source: str) -> EntrySite:
        """The site of one buffer (built once)."""
        site = self._sites.get((layer, kind, source))
        if site is None:
            site = self._sites[(layer, kind, source)] = EntrySite(kind, layer, source, slot=(id(self), layer, kind),
                                                                  cache=self.label)
        return site

    def refresh(self) -> None:
        """Find the buffers again (after the model re-created its caches, e.g. gpt-fast's setup_caches)."""
        model = self._model()
        if model is not None:
            self._buffers = find_kv_buffers(model, self.pattern)

    def end_manual(self) -> None:
        host = self._host()
        info, self.manual = self.manual, None
        if host is not None and info is not None and info.ended is None:
            host.end_manual(info)

    # nothing else to do at request ends, before reads, or for holder-chain searches (a `Source`)
    def request_ending(self, info: RequestInfo) -> None:
        return None

    def request_ended(self, info: RequestInfo) -> None:
        return None

    def sync(self) -> None:
        return None

    def cache_ref(self, rec: Record) -> weakref.ref[Any] | None:
        return None

    def chain_seeds(self, records: Sequence[Record]) -> tuple[dict[Any, Any], dict[Any, list[str]]]:
        return {}, {}

    def chain_hints(self, records: Sequence[Record]) -> list[Any]:
        return []

    def remove(self) -> None:
        self._handle.remove()
        host = self._host()
        if host is not None:
            host.remove_source(self)
