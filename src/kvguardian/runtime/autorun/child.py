"""Inside a program audited by `kv-guardian run`: instrument transformers when it is imported, audit at exit.

`activate` (called by the boot ``sitecustomize``) installs an import hook, so programs that never import
transformers pay almost nothing. At exit (``atexit``, plus a finalizer in forked ``multiprocessing`` children)
it runs `Guard.check` and writes ``report-<pid>.json`` into ``KVG_RUN_DIR``; ``started-``/``forked-``/``kv-<pid>``
markers tell the parent what a process that wrote no report had. Details: docs/design/autorun.md.
"""

from __future__ import annotations

import atexit
import gc
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import types
from collections.abc import Sequence
from typing import Any

from kvguardian.runtime.autorun import ENV_DIR, ENV_OPTIONS

__all__ = ["activate", "finish"]

_WATCH = ("transformers.cache_utils", "transformers.generation.utils", "transformers.modeling_utils")
_state: dict[str, Any] = {"guard": None, "status": None, "message": None, "dir": None, "options": {},
                          "started": time.time(), "done": False, "activated": False, "kv": False}


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the watched modules so kv-guardian runs right after they are executed."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _WATCH:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                loader = spec.loader
                if loader is not None and hasattr(loader, "exec_module"):
                    spec.loader = _Loader(loader, name)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        _on_imported(self._name)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._inner, name)


def activate() -> None:
    """Install the import hook and the exit handler (idempotent)."""
    if _state["activated"]:
        return
    _state["activated"] = True
    _state["dir"] = os.environ.get(ENV_DIR)
    try:
        _state["options"] = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
    except ValueError:
        _state["options"] = {}
    atexit.register(finish)
    os.register_at_fork(after_in_child=_forked)
    sys.meta_path.insert(0, _Finder())
    for name in _WATCH:  # already imported (another sitecustomize did it): act now
        if name in sys.modules:
            _on_imported(name)


def _say(msg: str) -> None:
    sys.stderr.write(f"kv-guardian run: {msg}\n")
    sys.stderr.flush()


def _on_imported(name: str) -> None:
    try:
        if name == "transformers.cache_utils":
            _start_guard()
        elif name == "transformers.generation.utils" and _state["guard"] is not None:
            from kvguardian.runtime.hf.instrument import install_generate_patch

            install_generate_patch()
        elif name == "transformers.modeling_utils" and _state["guard"] is not None:
            from kvguardian.runtime.hf.instrument import install_forward_patch

            install_forward_patch()  # a model forward's cache updates observed together, decode steps sampled
    except Exception as exc:  # fail open
        _state["status"] = "error"
        _state["message"] = f"instrumentation failed: {type(exc).__name__}: {exc}"
        _say(f"{_state['message']}; the program runs unaudited")


def _start_guard() -> None:
    if _state["guard"] is not None or _state["status"] is not None:
        return
    _marker("started")
    from kvguardian.core.errors import UsageError
    from kvguardian.runtime.hf.compat import check_transformers_version

    try:
        check_transformers_version()
    except UsageError as exc:
        _state["status"] = "unsupported"
        _state["message"] = str(exc)
        _say(f"{exc}; the program runs unaudited")
        return
    from kvguardian.runtime.guard import Guard

    opts = _state["options"]
    guard = Guard(
        retention_sampling=True,
        holder_search_seconds=float(opts.get("holder_seconds", 120.0)),
        redact=bool(opts.get("redact", False)),
        decode_stride=int(opts.get("decode_stride", 8)),
    )
    guard.attach_process(generate=False)  # generate is patched once generation.utils has finished loading
    guard.on_kv_growth = _first_kv
    _state["guard"] = guard
    _state["status"] = "audited"
    if "transformers.generation.utils" in sys.modules:
        from kvguardian.runtime.hf.instrument import install_generate_patch

        install_generate_patch()
    if hasattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel"):
        from kvguardian.runtime.hf.instrument import install_forward_patch

        install_forward_patch()


def _first_kv() -> None:
    """The guard's ``on_kv_growth`` hook: at the first cache update of this process, the ``kv-<pid>`` marker;
    then the hook is removed (it costs nothing afterwards)."""
    guard = _state["guard"]
    if guard is not None:
        guard.on_kv_growth = None
    _state["kv"] = True
    _marker("kv")


def _forked() -> None:
    """In a child forked after transformers was seen: it inherits the guard (and the KV its parent had) and
    must report too."""
    if _state["status"] is not None and not _state["done"]:
        _marker("forked")
        guard = _state["guard"]
        if guard is not None and not _state["kv"]:
            guard.on_kv_growth = _first_kv  # the parent's hook may be gone: this child's own first KV
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:  # multiprocessing clears its finalizers after the fork, then runs these
            mp_util.register_after_fork(_AFTER_FORK, _finish_in_worker)


class _Token:
    """What `multiprocessing.util.register_after_fork` keeps a weak reference to."""


_AFTER_FORK = _Token()


def _finish_in_worker(_: object) -> None:
    """In a forked multiprocessing child: audit when its target returns (it then ends with ``os._exit``,
    which skips ``atexit``). Priority -100: after the program's own finalizers."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, finish, exitpriority=-100)


def _marker(kind: str) -> None:
    """``<kind>-<pid>``: this process has KV to audit; JSON naming its argv and whether multiprocessing
    started it (a pool's workers end without exit handlers)."""
    folder = _state["dir"]
    if not folder:
        return
    worker = "--multiprocessing-fork" in getattr(sys, "orig_argv", ())  # spawn/forkserver children
    try:
        with open(os.path.join(folder, f"{kind}-{os.getpid()}"), "w") as fh:
            json.dump({"argv": list(sys.argv), "multiprocessing": worker, "kv": _state["kv"]}, fh)
    except (OSError, ValueError, TypeError):
        pass


def finish() -> None:
    """Audit and write this process's report (the exit handler)."""
    if _state["done"] or _state["status"] is None:
        return
    _state["done"] = True
    guard = _state["guard"]
    payload: dict[str, Any] = {"pid": os.getpid(), "argv": list(sys.argv), "status": _state["status"],
                               "message": _state["message"], "seconds": round(time.time() - _state["started"], 3)}
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        if guard is not None:
            # an uncaught exception leaves its traceback (and the frames' KV) in sys.last_*: an artifact of
            # the crash handler, not of the program's own references
            crashed = getattr(sys, "last_value", None) is not None
            for attr in ("last_type", "last_value", "last_traceback", "last_exc"):
                if getattr(sys, attr, None) is not None:
                    setattr(sys, attr, None)
            # gc.freeze() (pre-fork servers call it after warm-up) hides the frozen objects from the
            # garbage collector's referrer queries, so from the holder search; at exit nothing is gained by
            # keeping them frozen
            if gc.get_freeze_count():
                gc.unfreeze()
            report = guard.check(end_implicit=True)
            payload["crashed"] = crashed
            payload["report"] = report.to_dict()
            payload["events"] = [e.to_dict() for e in guard.events() if e.scope == "cache"][-200:]
            guard.detach_process()
    except Exception as exc:
        payload["status"] = "error"
        payload["message"] = f"audit failed: {type(exc).__name__}: {exc}"
    payload["audit_seconds"] = round(time.perf_counter() - t0, 3)
    payload["audit_cpu_seconds"] = round(time.process_time() - c0, 3)  # all threads' CPU time meanwhile
    folder = _state["dir"]
    if not folder:
        return
    try:
        path = os.path.join(folder, f"report-{os.getpid()}.json")
        tmp = path + ".tmp"
        text = json.dumps(payload, default=str)  # dumps, not dump: json.dump encodes in Python, dumps in C
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        _say(f"could not write the audit report: {exc}")
